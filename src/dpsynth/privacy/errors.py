"""Exceptions raised by the privacy core: all are :class:`dpsynth.errors.PrivacyError`, and keep
their ValueError/RuntimeError bases for callers that catch those."""

from __future__ import annotations

from ..errors import PrivacyError


class PrivacyConfigError(PrivacyError, ValueError):
    """A privacy parameter is invalid (the message names the parameter)."""


class BudgetExceededError(PrivacyError, RuntimeError):
    """A release would take the run's epsilon (at the target delta) above its target."""


class BudgetRefusedError(PrivacyError, RuntimeError):
    """The cross-run budget ledger refused a reservation for a dataset."""
