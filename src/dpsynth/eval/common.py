"""Errors and small helpers shared by the evaluation modules."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import InputError


class MetricUnavailable(ValueError):
    """A metric that cannot be computed on this input (too few samples, one class, ...).

    The message says why; evaluation output records ``{"unavailable": message}`` instead of
    printing a number that would mean nothing.
    """


class EvalInputError(InputError):
    """Bad input to an evaluation (missing release/, mismatched labels, ...), clearly named."""


def unavailable(reason: str) -> dict[str, str]:
    return {"unavailable": reason}


def is_unavailable(value: Any) -> bool:
    return isinstance(value, dict) and "unavailable" in value


def guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; a :class:`MetricUnavailable` becomes ``{"unavailable": reason}``."""
    try:
        return fn(*args, **kwargs)
    except MetricUnavailable as err:
        return unavailable(str(err))


def fmt_metric(value: Any, digits: int = 3) -> str:
    """Human-readable cell: a number, or 'unavailable: reason'."""
    if value is None:
        return "-"
    if is_unavailable(value):
        return f"unavailable: {value['unavailable']}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}f}"
    return str(value)
