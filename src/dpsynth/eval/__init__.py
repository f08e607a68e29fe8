"""Evaluation of synthetic text: fidelity, utility, privacy audits and the run report.

Pure metric functions live in :mod:`.fidelity`, :mod:`.utility` and :mod:`.audits`;
:mod:`.suite` evaluates a run folder, :mod:`.view` builds the user's utility table and
verdict, :mod:`.report` renders the HTML pages (Jinja2) and :mod:`.canary` runs the canary
audit loop. Heavy libraries load inside the functions.
"""

from .audits import (
    count_canary_hits,
    dcr_audit,
    insert_canaries,
    membership_inference,
    pii_leakage,
)
from .common import EvalInputError, MetricUnavailable
from .fidelity import fid, frechet_distance, knn_precision_recall, mauve_score
from .utility import finetune_scores, logreg_scores, next_token_accuracy
from .view import utility_tables, verdict, versus_zero_shot

__all__ = [
    "EvalInputError",
    "MetricUnavailable",
    "count_canary_hits",
    "dcr_audit",
    "fid",
    "finetune_scores",
    "frechet_distance",
    "insert_canaries",
    "knn_precision_recall",
    "logreg_scores",
    "mauve_score",
    "membership_inference",
    "next_token_accuracy",
    "pii_leakage",
    "utility_tables",
    "verdict",
    "versus_zero_shot",
]
