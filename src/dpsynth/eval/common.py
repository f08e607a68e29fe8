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


#: No number is shown with more significant digits than this (issue 46: a score carries about
#: three; a noise multiplier printed to 16 digits pretends to a precision nobody has).
MAX_SIGNIFICANT = 4


def fmt_number(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals, but at most :data:`MAX_SIGNIFICANT` significant
    digits (12.3456 -> 12.35, 123456.7 -> 123500, 0.612345 -> 0.612)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    magnitude = math.floor(math.log10(abs(value))) + 1  # digits before the point
    decimals = max(0, min(digits, MAX_SIGNIFICANT - magnitude))
    if magnitude > MAX_SIGNIFICANT:
        return f"{round(value, MAX_SIGNIFICANT - magnitude):.0f}"
    return f"{value:.{decimals}f}"


def fmt_metric(value: Any, digits: int = 3) -> str:
    """Human-readable cell: a number (``digits`` decimals, at most four significant digits),
    or 'unavailable: reason'."""
    if value is None:
        return "-"
    if is_unavailable(value):
        return f"unavailable: {value['unavailable']}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return fmt_number(value, digits)
    return str(value)
