"""The user's view of utility: per label column, synthetic vs the references (docs/methods.md §5).

One table per (classifier, label column), built from the ``utility`` block that
:func:`dpsynth.eval.suite.evaluate_run` computes, rows in a fixed order:

* **synthetic**: trained on release/synthetic.jsonl;
* **zero-shot reference**: trained on zero-shot generations that saw no private data;
* **real-trained**: trained on the private data (operator view only: it is computed on the
  private data and is not covered by the DP guarantee);
* **chance**: always predicting the test split's most frequent label (accuracy = majority
  share; macro-F1 = that class's F1 / number of test classes).

:func:`versus_zero_shot` and :func:`verdict` say whether the synthetic data beat the
zero-shot reference, in accuracy points per label column. Both use shareable values only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .common import fmt_metric, is_unavailable

#: Row keys of the utility block in table order, with the names the user sees.
ROWS: tuple[tuple[str, str], ...] = (
    ("synthetic", "synthetic"),
    ("zero_shot", "zero-shot reference"),
    ("private", "real-trained"),
    ("chance", "chance (majority class)"),
)
#: Rows computed on the private data: only in the operator's view.
OPERATOR_ROWS = frozenset({"private"})
KIND_TITLES = {"logreg": "logistic regression on sentence embeddings",
               "finetune": "fine-tuned MiniLM classifier"}
NOT_GIVEN = "not given"


@dataclass(frozen=True)
class ScoreRow:
    """One training set's test scores; ``note`` says why a score is missing."""

    key: str
    name: str
    accuracy: float | None
    macro_f1: float | None
    note: str = ""


@dataclass(frozen=True)
class UtilityTable:
    """Synthetic vs references for one classifier and one label column."""

    kind: str
    column: str
    rows: tuple[ScoreRow, ...]

    @property
    def title(self) -> str:
        return f"{self.column}: {KIND_TITLES.get(self.kind, self.kind)}"


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _row(key: str, name: str, cell: Any, chance_f1: Any = None) -> ScoreRow:
    if key == "chance":
        return ScoreRow(key, name, _number(cell), _number(chance_f1))
    if isinstance(cell, dict) and "accuracy" in cell:
        return ScoreRow(key, name, _number(cell["accuracy"]), _number(cell.get("macro_f1")))
    if key == "zero_shot" and (cell is None or _zero_shot_missing(cell)):
        return ScoreRow(key, name, None, None, NOT_GIVEN)
    return ScoreRow(key, name, None, None, fmt_metric(cell))


def _zero_shot_missing(cell: Any) -> bool:
    return is_unavailable(cell) and str(cell["unavailable"]).startswith(NOT_GIVEN)


def utility_tables(utility: dict[str, Any] | None, *, operator: bool) -> list[UtilityTable]:
    """The tables of a utility block; the real-trained row only when ``operator``."""
    tables = []
    for kind in ("logreg", "finetune"):
        per_col = (utility or {}).get(kind)
        if not isinstance(per_col, dict):
            continue
        for column, block in per_col.items():
            rows = tuple(
                _row(key, name, block.get(key), block.get("chance_macro_f1"))
                for key, name in ROWS if operator or key not in OPERATOR_ROWS
            )
            tables.append(UtilityTable(kind, str(column), rows))
    return tables


def _points(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(100.0 * (a - b), 1)


def versus_zero_shot(utility: dict[str, Any] | None) -> dict[str, Any]:
    """Per classifier and label column: synthetic minus zero-shot in points (accuracy and
    macro-F1) and whether synthetic is ahead; ``{"unavailable": reason}`` where it cannot say.
    Unlabeled corpora compare next-token accuracy under the key ``next_token``."""
    out: dict[str, Any] = {}
    for table in utility_tables(utility, operator=False):
        rows = {r.key: r for r in table.rows}
        syn, zs = rows["synthetic"], rows["zero_shot"]
        if syn.accuracy is None or zs.accuracy is None:
            reason = zs.note if zs.accuracy is None else f"synthetic: {syn.note}"
            out.setdefault(table.kind, {})[table.column] = {"unavailable": reason}
            continue
        acc = _points(syn.accuracy, zs.accuracy)
        out.setdefault(table.kind, {})[table.column] = {
            "accuracy_points": acc,
            "macro_f1_points": _points(syn.macro_f1, zs.macro_f1),
            "beats_zero_shot": bool(acc is not None and acc > 0),
        }
    nt = (utility or {}).get("next_token")
    if isinstance(nt, dict):
        syn_acc = _number((nt.get("synthetic") or {}).get("accuracy"))
        zs_cell = nt.get("zero_shot")
        zs_acc = _number(zs_cell.get("accuracy")) if isinstance(zs_cell, dict) else None
        if syn_acc is None or zs_acc is None:
            out["next_token"] = {"unavailable": NOT_GIVEN if zs_acc is None else "synthetic"}
        else:
            acc = _points(syn_acc, zs_acc)
            out["next_token"] = {"accuracy_points": acc,
                                 "beats_zero_shot": bool(acc is not None and acc > 0)}
    return out


def _signed(points: float | None) -> str:
    return "n/a" if points is None else f"{points:+.1f}"


def verdict(comparison: dict[str, Any]) -> str:
    """One line: did the synthetic data beat the zero-shot reference, by how many points."""
    parts, wins, total = [], 0, 0
    for kind, per_col in comparison.items():
        if kind == "next_token":
            cell = per_col
            if "unavailable" in cell:
                parts.append(f"next-token accuracy: zero-shot reference {cell['unavailable']}")
                continue
            total += 1
            wins += cell["beats_zero_shot"]
            parts.append(f"next-token accuracy {_signed(cell['accuracy_points'])} points")
            continue
        for column, cell in per_col.items():
            if "unavailable" in cell:
                parts.append(f"{column} ({kind}): zero-shot reference {cell['unavailable']}")
                continue
            total += 1
            wins += cell["beats_zero_shot"]
            parts.append(f"{column} ({kind}) {_signed(cell['accuracy_points'])} accuracy points"
                         f" (macro-F1 {_signed(cell['macro_f1_points'])})")
    if total == 0:
        head = "Synthetic vs zero-shot: no comparison"
    elif wins == total:
        head = "The synthetic data beat the zero-shot reference"
    elif wins == 0:
        head = "The synthetic data did not beat the zero-shot reference"
    else:
        head = f"The synthetic data beat the zero-shot reference on {wins} of {total}"
    return f"{head}: {'; '.join(parts)}." if parts else f"{head}."
