"""The user's view of utility: per label column, synthetic vs the references (docs/methods.md §5).

One table per (classifier, label column), built from the ``utility`` block that
:func:`dpsynth.eval.suite.evaluate_run` computes, rows in a fixed order:

* **synthetic**: trained on release/synthetic.jsonl;
* **zero-shot reference**: trained on zero-shot generations that saw no private data;
* **real-trained**: trained on the private data (operator view only: it is computed on the
  private data and is not covered by the DP guarantee);
* **real-trained at the synthetic set's size**: trained on a seeded draw of as many private
  records as the synthetic set has texts (operator view only): what a release of that size
  could give if its texts were real records, the ceiling the set's size puts on it;
* **chance**: always predicting the test split's most frequent label (accuracy = majority
  share; macro-F1 = that class's F1 / number of test classes).

:func:`versus_zero_shot` and :func:`verdict` say whether the synthetic data beat the
zero-shot reference, in accuracy points per label column, worded from the 95 % interval of the
difference (paired on the same test examples where eval.json has their counts). Both use
shareable values only. :func:`in_context` gives the report's headline numbers: synthetic beside
zero-shot, the majority-class rate and (operator only) real-trained with the gap closed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .common import fmt_metric, is_unavailable
from .utility import difference_interval

#: Row keys of the utility block in table order, with the names the user sees.
ROWS: tuple[tuple[str, str], ...] = (
    ("synthetic", "synthetic"),
    ("zero_shot", "zero-shot reference"),
    ("private", "real-trained"),
    ("private_at_size", "real-trained, as many records as synthetic texts"),
    ("chance", "chance (majority class)"),
)
#: Rows computed on the private data: only in the operator's view.
OPERATOR_ROWS = frozenset({"private", "private_at_size"})
KIND_TITLES = {"logreg": "logistic regression on sentence embeddings",
               "finetune": "fine-tuned MiniLM classifier"}
NOT_GIVEN = "not given"
#: The utility row's per-example counts of the synthetic and zero-shot classifiers
#: (:func:`dpsynth.eval.suite.paired_block`).
PAIRED_KEY = "synthetic_vs_zero_shot"


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


def _n_test(cell: Any) -> int | None:
    n = cell.get("n_test") if isinstance(cell, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _paired(block: Any) -> dict[str, int] | None:
    """The utility row's per-example counts (``synthetic_vs_zero_shot``) in the form
    :func:`.utility.difference_interval` reads, or None."""
    cell = block.get(PAIRED_KEY) if isinstance(block, dict) else None
    keys = ("n", "both", "synthetic_only", "zero_shot_only", "neither")
    if not isinstance(cell, dict) or not all(isinstance(cell.get(k), int) for k in keys):
        return None
    return {"n": cell["n"], "both": cell["both"], "first_only": cell["synthetic_only"],
            "second_only": cell["zero_shot_only"], "neither": cell["neither"]}


def _interval(syn: float, zs: float, syn_cell: Any, zs_cell: Any, block: Any
              ) -> tuple[list[float] | None, str | None]:
    """The 95 % interval of synthetic minus zero-shot accuracy in points, and how it was
    computed ("paired" on the same test examples, or "independent"); (None, None) when the
    test-set size is unknown."""

    paired = _paired(block)
    n_syn, n_zs = _n_test(syn_cell), _n_test(zs_cell)
    if paired is None and (n_syn is None or n_zs is None):
        return None, None
    low, high = difference_interval(syn, zs, n_syn or 0, n_zs or 0, paired)
    return [round(100 * low, 1), round(100 * high, 1)], "paired" if paired else "independent"


def _measured(interval: list[float] | None) -> str:
    """gain, loss or none (the interval covers zero); unknown without an interval."""
    if interval is None:
        return "unknown"
    return "gain" if interval[0] > 0 else "loss" if interval[1] < 0 else "none"


def versus_zero_shot(utility: dict[str, Any] | None) -> dict[str, Any]:
    """Per classifier and label column: synthetic minus zero-shot in points (accuracy and
    macro-F1), whether synthetic is ahead (``beats_zero_shot``, the point difference), the 95 %
    interval of the accuracy difference (``interval_points``; ``interval``: paired or
    independent) and what it shows (``measurable``: gain, loss, none or unknown);
    ``{"unavailable": reason}`` where it cannot say. Unlabeled corpora compare next-token
    accuracy under the key ``next_token``."""
    out: dict[str, Any] = {}
    for table in utility_tables(utility, operator=False):
        rows = {r.key: r for r in table.rows}
        syn, zs = rows["synthetic"], rows["zero_shot"]
        if syn.accuracy is None or zs.accuracy is None:
            reason = zs.note if zs.accuracy is None else f"synthetic: {syn.note}"
            out.setdefault(table.kind, {})[table.column] = {"unavailable": reason}
            continue
        block = ((utility or {}).get(table.kind) or {}).get(table.column) or {}
        acc = _points(syn.accuracy, zs.accuracy)
        interval, how = _interval(syn.accuracy, zs.accuracy, block.get("synthetic"),
                                  block.get("zero_shot"), block)
        out.setdefault(table.kind, {})[table.column] = {
            "accuracy_points": acc,
            "macro_f1_points": _points(syn.macro_f1, zs.macro_f1),
            "beats_zero_shot": bool(acc is not None and acc > 0),
            "interval_points": interval,
            "interval": how,
            "measurable": _measured(interval),
        }
    nt = (utility or {}).get("next_token")
    if isinstance(nt, dict):
        syn_cell, zs_cell = nt.get("synthetic") or {}, nt.get("zero_shot")
        syn_acc = _number(syn_cell.get("accuracy")) if isinstance(syn_cell, dict) else None
        zs_acc = _number(zs_cell.get("accuracy")) if isinstance(zs_cell, dict) else None
        if syn_acc is None or zs_acc is None:
            out["next_token"] = {"unavailable": NOT_GIVEN if zs_acc is None else "synthetic"}
        else:
            acc = _points(syn_acc, zs_acc)
            tokens = {"n_test": syn_cell.get("n_test_tokens")}, {
                "n_test": zs_cell.get("n_test_tokens") if isinstance(zs_cell, dict) else None}
            interval, how = _interval(syn_acc, zs_acc, *tokens, None)
            out["next_token"] = {"accuracy_points": acc,
                                 "beats_zero_shot": bool(acc is not None and acc > 0),
                                 "interval_points": interval, "interval": how,
                                 "measurable": _measured(interval)}
    return out


def signed(points: float | None) -> str:
    """``+1.5`` / ``-0.3`` (never ``-0.0``); ``n/a`` for None."""
    if points is None:
        return "n/a"
    return f"{points + 0.0:+.1f}".replace("-0.0", "+0.0")


def interval_text(interval: list[float] | None) -> str:
    """``95 % interval -1.8 to +2.6``, or a note that there is none."""
    if interval is None:
        return "no interval: the test-set size is unknown"
    return f"95 % interval {signed(interval[0])} to {signed(interval[1])}"


def gain_sentence(points: float | None, interval: list[float] | None) -> str:
    """What the private votes added over zero-shot, worded from the interval, not the point
    difference: "the private votes added no measurable accuracy over zero-shot (+0.4 points,
    95 % interval -1.8 to +2.6)"."""
    numbers = f"{signed(points)} points, {interval_text(interval)}"
    measured = _measured(interval)
    if measured == "gain":
        return f"the private votes added accuracy over zero-shot ({numbers})"
    if measured == "loss":
        return f"the synthetic set scored below zero-shot ({numbers})"
    if measured == "none":
        return f"the private votes added no measurable accuracy over zero-shot ({numbers})"
    return f"synthetic minus zero-shot: {numbers}"


def _cell_text(cell: dict[str, Any]) -> str:
    interval = interval_text(cell.get("interval_points")) if "interval" in cell else None
    return f"{signed(cell['accuracy_points'])} accuracy points" + (
        f" ({interval}" if interval else " (") + (
        f"; macro-F1 {signed(cell['macro_f1_points'])})" if "macro_f1_points" in cell
        else ")")


def verdict(comparison: dict[str, Any]) -> str:
    """One line: did the synthetic data beat the zero-shot reference, by how many points, and
    is the difference measurable (its 95 % interval clear of zero)."""
    parts, wins, losses, total = [], 0, 0, 0
    for kind, per_col in comparison.items():
        cells = [("next-token accuracy", per_col)] if kind == "next_token" else [
            (f"{column} ({kind})", cell) for column, cell in per_col.items()]
        for name, cell in cells:
            if "unavailable" in cell:
                parts.append(f"{name}: zero-shot reference {cell['unavailable']}")
                continue
            total += 1
            measured = cell.get("measurable", "gain" if cell["beats_zero_shot"] else "none")
            wins += measured == "gain"
            losses += measured == "loss"
            parts.append(f"{name} {_cell_text(cell)}")
    if total == 0:
        head = "Synthetic vs zero-shot: no comparison"
    elif wins == total:
        head = "The synthetic data beat the zero-shot reference"
    elif losses == total:
        head = "The synthetic data scored below the zero-shot reference"
    elif wins == 0:
        head = ("The private votes added no measurable accuracy over the zero-shot reference "
                "(the 95 % interval includes zero)")
    else:
        head = f"The synthetic data beat the zero-shot reference measurably on {wins} of {total}"
    return f"{head}: {'; '.join(parts)}." if parts else f"{head}."


@dataclass(frozen=True)
class InContext:
    """One headline line: the synthetic classifier's accuracy beside its baselines."""

    kind: str
    column: str
    synthetic: float
    zero_shot: float | None
    majority: float | None
    real: float | None
    points: float | None
    interval: list[float] | None
    gap_closed: float | None
    real_at_size: float | None = None

    @property
    def size_ceiling(self) -> float | None:
        """The share of the zero-shot -> real gap that real records as many as the synthetic
        texts close: what a release of this size could close at best (None: not computed)."""
        if self.real_at_size is None or self.real is None or self.zero_shot is None or \
                self.real - self.zero_shot < 0.005:
            return None
        return (self.real_at_size - self.zero_shot) / (self.real - self.zero_shot)

    @property
    def size_sentence(self) -> str:
        """The operator's line on the release's size, '' where not computed."""
        ceiling = self.size_ceiling
        if ceiling is None or self.real_at_size is None:
            return ""
        return (f"real records as many as the synthetic texts score {self.real_at_size:.3f}, "
                f"{100 * ceiling:.0f} % of the gap: the most a release of this size is likely "
                "to close; a larger release (synthesis.samples) costs no budget")

    @property
    def sentence(self) -> str:
        """The verdict on the private votes, worded from the interval."""
        if self.zero_shot is None:
            return "no zero-shot set to compare with"
        return gain_sentence(self.points, self.interval)


def in_context(utility: dict[str, Any] | None, *, operator: bool,
               majority: Callable[[str], float | None] | None = None) -> list[InContext]:
    """Per classifier and label column with a synthetic score: synthetic, zero-shot, the
    majority-class rate (from the row, else ``majority(column)``) and, when ``operator``, the
    real-trained score and the share of the zero-shot -> real gap the synthetic set closed."""
    comparison = versus_zero_shot(utility)
    out = []
    for table in utility_tables(utility, operator=operator):
        rows = {r.key: r for r in table.rows}
        syn = rows["synthetic"].accuracy
        if syn is None:
            continue
        zs = rows["zero_shot"].accuracy
        chance = rows["chance"].accuracy
        if chance is None and majority is not None:
            chance = majority(table.column)
        real = rows["private"].accuracy if "private" in rows else None
        at_size = rows["private_at_size"].accuracy if "private_at_size" in rows else None
        cell = (comparison.get(table.kind) or {}).get(table.column) or {}
        gap = None
        if real is not None and zs is not None and real - zs >= 0.005:
            gap = (syn - zs) / (real - zs)
        out.append(InContext(table.kind, table.column, syn, zs, chance, real,
                             cell.get("accuracy_points"), cell.get("interval_points"), gap,
                             at_size))
    return out
