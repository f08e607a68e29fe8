"""The privacy guarantee of release/privacy.json in words, the same everywhere it is shown
(the run summary on the terminal, the report's headline, the Python API): epsilon to three
significant digits, the unit, the accountant and how the noise was drawn."""

from __future__ import annotations

import math
from typing import Any


def format_epsilon(value: Any) -> str:
    """Epsilon to 3 significant digits (``3.9999165`` -> ``4``, ``0.76861`` -> ``0.769``);
    ``inf`` for a non-private run; ``-`` when absent."""
    if value is None:
        return "-"
    try:
        eps = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isinf(eps):
        return "inf"
    return f"{eps:.3g}"


def format_delta(value: Any) -> str:
    """Delta as ``1e-05`` style (2 significant digits); ``-`` when absent."""
    if value is None:
        return "-"
    try:
        return f"{float(value):.2g}"
    except (TypeError, ValueError):
        return str(value)


def stop_reason(err: BaseException) -> str:
    """SIGINT / SIGTERM for a stopped run (a bare KeyboardInterrupt is Ctrl-C: SIGINT)."""
    return str(err) or "SIGINT"


def guarantee_sentence(privacy: dict[str, Any] | None) -> str:
    """One sentence: what the release guarantees (e.g. "(4, 1e-05)-differential privacy for
    each record, accounted with pld")."""
    if not privacy:
        return "No privacy statement (release/privacy.json is missing)."
    eps = privacy.get("epsilon")
    unit = privacy.get("unit", "record")
    if eps is None:
        protection = privacy.get("secret_protection")
        if isinstance(protection, dict) and protection.get("summary"):
            return (f"(p, r)-secret protection of the named secrets ({protection['summary']}); "
                    "not differential privacy.")
        return "No epsilon in release/privacy.json."
    if format_epsilon(eps) == "inf":
        return "Not differentially private (epsilon = infinity): no formal guarantee."
    text = (f"({format_epsilon(eps)}, {format_delta(privacy.get('delta'))})-differential "
            f"privacy for each {unit}")
    if privacy.get("accountant"):
        text += f", accounted with {privacy['accountant']}"
    return text + "."
