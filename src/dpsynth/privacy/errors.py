"""Exceptions raised by the privacy core."""

from __future__ import annotations


class PrivacyConfigError(ValueError):
    """A privacy parameter is invalid (the message names the parameter)."""


class BudgetExceededError(RuntimeError):
    """A release would take the run's epsilon (at the target delta) above its target."""


class BudgetRefusedError(RuntimeError):
    """The cross-run budget ledger refused a reservation for a dataset."""
