"""The run report: a shareable HTML page, an operator-only page, and a comparison table.

Two pages per run (docs/methods.md §5 evaluation, §6 threat model):

* the **shareable** report (default ``RUN_DIR/eval/report.html``) holds only values computed
  from ``release/`` and public inputs: the privacy statement (with its noise mode), the
  release summary, ``stats.jsonl`` curves, synthetic samples and label shares, and the
  evaluations of the released sets (synthetic, zero-shot) on the public test data;
* the **operator-only** report (``RUN_DIR/private/report-operator.html``, mode 0600) adds
  everything computed on the private data: the private-trained reference classifier, DCR,
  membership inference, PII and canary audits. It is marked "operator only - do not share".

The headline puts the synthetic classifier's test accuracy beside zero-shot and the
majority-class rate (the operator's page adds real-trained and the share of the zero-shot ->
real gap closed), with a verdict worded from the 95 % interval of the difference
(:mod:`.view`). Every number has at most four significant digits; JSON keys are shown in words
(:data:`FIELD_WORDS`); the sample table shows released samples of every label.

Neither page opens the private data file; the operator page reads the evaluator's own
results (``eval/eval.json`` with ``private/eval/reference.json``, the audits). The HTML is the
Jinja2 template ``templates/report.html.j2`` (autoescaped); plots are matplotlib PNGs inlined
as base64 data URIs; a Content-Security-Policy forbids any external load.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import require
from ..evolution.prompts import MOSTLY_CUT, cut_share
from ..files import SHARED_MODE, atomic_write_text
from ..statement import format_delta, format_epsilon, guarantee_sentence
from .common import EvalInputError, fmt_metric, fmt_number, is_unavailable
from .release import RunRelease, load_run
from .utility import majority_share_of_file
from .view import InContext, UtilityTable, in_context, utility_tables, verdict, versus_zero_shot

# -- plots ----------------------------------------------------------------------------------


def _figure(width: float = 6.0, height: float = 3.2) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Any) -> str:
    from matplotlib.ticker import MaxNLocator

    for ax in fig.axes:
        if ax.get_xlabel() == "iteration":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _series(stats: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(stats):
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(float(row.get("iteration", i)))
            ys.append(float(value))
    return xs, ys


def _iteration_axis(ax: Any, xs: Sequence[float]) -> None:
    """Ticks exactly at the iterations, with half an iteration of room on each side."""
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(int(t)) for t in ticks])
    ax.set_xlim(min(ticks) - 0.5, max(ticks) + 0.5)
    ax.set_xlabel("iteration")


def _lines_or_bars(title: str, series: Sequence[tuple[str, list[float], list[float], str]],
                   ylabel: str | None = None) -> str | None:
    fig = iteration_figure(title, series, ylabel)
    return None if fig is None else _png(fig)


def iteration_figure(title: str, series: Sequence[tuple[str, list[float], list[float], str]],
                     ylabel: str | None = None) -> Any:
    """One figure of ``(label, xs, ys, style)`` series: lines over the iterations when there
    are two or more (a tick at each iteration), else one bar per series with its number (a
    single iteration is a number, not a line); None without data."""
    series = [s for s in series if s[2]]
    if not series:
        return None
    iterations = sorted({x for _, xs, _, _ in series for x in xs})
    fig = _figure()
    ax = fig.add_subplot()
    if len(iterations) < 2:
        names = [name for name, _, _, _ in series]
        values = [ys[-1] for _, _, ys, _ in series]
        bars = ax.bar(names, values, color=["tab:blue", "tab:orange", "tab:green",
                                            "tab:red"][:len(names)], width=0.5)
        ax.bar_label(bars, labels=[f"{v:.4g}" for v in values], padding=2)
        ax.set_ylim(0, max(values + [1e-9]) * 1.2)
        title += f" (iteration {int(iterations[0])}, the only one)" if iterations else ""
    else:
        for name, xs, ys, style in series:
            ax.plot(xs, ys, style, label=name)
        _iteration_axis(ax, iterations)
        ax.legend()
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig


def plot_kept(stats: Sequence[dict[str, Any]]) -> str | None:
    """Kept samples (and candidates) per iteration."""
    return _lines_or_bars("Samples per iteration", [
        ("kept samples", *_series(stats, "kept"), "o-"),
        ("candidates", *_series(stats, "candidates"), "s--")], ylabel="count")


def plot_votes(stats: Sequence[dict[str, Any]]) -> str | None:
    """The votes cast in each iteration (all candidates together) against the standard
    deviation of the noise added to each candidate's count."""
    return _lines_or_bars("Votes cast vs noise per candidate", [
        ("votes cast (all candidates)", *_series(stats, "vote_mass"), "o-"),
        ("noise std. dev. per candidate", *_series(stats, "noise_sigma"), "s--")],
        ylabel="votes")


def plot_filtered(stats: Sequence[dict[str, Any]]) -> str | None:
    """The share of each iteration's generated texts the public-side filter dropped as
    off-task (chatter, echoes of the prompt, placeholders, refusals, duplicates)."""
    return _lines_or_bars("Generated texts filtered out as off-task", [
        ("share filtered", *_series(stats, "filtered_share"), "o-")],
        ylabel="share of the generated texts")


#: Above this share of filtered generations the report says most of them were off-task.
MOSTLY_FILTERED = 0.5


def filtered_caveat(stats: Sequence[dict[str, Any]]) -> str | None:
    """A caveat when most of some iteration's generations were filtered out as off-task."""
    xs, ys = _series(stats, "filtered_share")
    worst = [(x, y) for x, y in zip(xs, ys, strict=True) if y > MOSTLY_FILTERED]
    if not worst:
        return None
    x, y = max(worst, key=lambda p: p[1])
    return (f"Most generated texts were off-task: the filter dropped {100 * y:.0f} % of "
            f"iteration {int(x)}'s generations ({len(worst)} of {len(xs)} iterations above "
            f"{100 * MOSTLY_FILTERED:.0f} %). The models write few records of the task; the "
            "release is drawn from what was left.")


def cut_caveat(texts: Sequence[str]) -> str | None:
    """A caveat when more than :data:`~dpsynth.evolution.prompts.MOSTLY_CUT` of the released
    texts stop mid-sentence (release/synthetic.jsonl is public; the run warns alike)."""
    share = cut_share(texts)
    if share <= MOSTLY_CUT:
        return None
    return (f"{100 * share:.0f} % of the released texts stop mid-sentence: the generators' "
            "token cap cut them with no full sentence to trim back to. A larger cap on new "
            "tokens (for DP fine-tuning, also on the tokens it trains on of each record) "
            "lets them end.")


def plot_fid(stats: Sequence[dict[str, Any]]) -> str | None:
    """FID of each iteration's pool against the test data; the title says when the pools
    differ in size (FID grows as the sample shrinks, so unequal sizes do not compare)."""
    sizes = sorted({int(r["n"]) for r in stats if isinstance(r.get("n"), int)})
    title = "FID per iteration"
    if len(sizes) > 1:
        title += f" (unequal pool sizes, {sizes[0]:,} to {sizes[-1]:,} texts: not comparable)"
    elif sizes:
        title += f" ({sizes[0]:,} texts each)"
    return _lines_or_bars(title, [("FID", *_series(stats, "fid"), "o-")],
                          ylabel="FID (lower is closer)")


def plot_generator_weights(stats: Sequence[dict[str, Any]]) -> str | None:
    """WASP: each generator's weight per iteration (bars for a single iteration)."""
    rows = [r for r in stats if isinstance(r.get("generator_weights"), dict)]
    if not rows:
        return None
    names = sorted({name for r in rows for name in r["generator_weights"]})
    xs = [float(r.get("iteration", i)) for i, r in enumerate(rows)]
    fig = _figure()
    ax = fig.add_subplot()
    if len(set(xs)) < 2:
        values = [float(rows[-1]["generator_weights"].get(n, 0.0)) for n in names]
        bars = ax.bar(names, values, width=0.5)
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2)
    else:
        for name in names:
            ax.plot(xs, [float(r["generator_weights"].get(name, 0.0)) for r in rows],
                    marker="o", label=name)
        _iteration_axis(ax, xs)
        ax.legend()
    ax.set_ylabel("weight")
    ax.set_ylim(0, 1.1)
    ax.set_title("Generator weights (WASP)")
    return _png(fig)


#: Label values shown in a label plot; the rest are summed into one "other" bar.
MAX_LABEL_BARS = 25


def _wrap_label(value: str, width: int = 28) -> str:
    import textwrap

    lines = textwrap.wrap(value, width) or [value]
    return "\n".join(lines[:2]) + ("..." if len(lines) > 2 else "")


def plot_labels(column: str, synthetic: dict[str, float], real: dict[str, float] | None
                ) -> str:
    """Label shares as horizontal bars (every name readable, long ones wrapped): synthetic
    (release) and, when evaluated, the real test data; beyond :data:`MAX_LABEL_BARS` values
    the smallest are summed into "other"."""
    keys = sorted(set(synthetic) | set(real or {}),
                  key=lambda k: (-(synthetic.get(k, 0) + (real or {}).get(k, 0)), k))
    syn, rea = dict(synthetic), dict(real or {})
    if len(keys) > MAX_LABEL_BARS:
        rest = keys[MAX_LABEL_BARS - 1:]
        keys = keys[:MAX_LABEL_BARS - 1] + [f"other ({len(rest)} values)"]
        syn[keys[-1]] = sum(synthetic.get(k, 0) for k in rest)
        rea[keys[-1]] = sum((real or {}).get(k, 0) for k in rest)
    fig = _figure(width=7.0, height=max(2.2, 0.42 * len(keys) * (1.6 if real else 1) + 1.2))
    ax = fig.add_subplot()
    pos = list(range(len(keys)))
    height = 0.4 if real else 0.7
    ax.barh([p - (height / 2 if real else 0) for p in pos], [syn.get(k, 0) for k in keys],
            height=height, label="synthetic")
    if real:
        ax.barh([p + height / 2 for p in pos], [rea.get(k, 0) for k in keys], height=height,
                label="real test")
    ax.set_yticks(pos)
    ax.set_yticklabels([_wrap_label(k) for k in keys], fontsize=9)
    ax.invert_yaxis()  # the most frequent on top
    ax.set_xlabel("share of the samples")
    ax.set_title(f"Label distribution: {column}")
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


_SET_COLOURS = {"synthetic": "tab:blue", "zero_shot": "tab:orange", "private": "tab:green",
                "chance": "tab:gray"}
#: The names a reader sees for the training sets and classifiers eval.json keys.
SET_NAMES = {"synthetic": "synthetic", "zero_shot": "zero-shot", "private": "real-trained"}
KIND_NAMES = {"logreg": "logistic regression", "finetune": "fine-tuned MiniLM"}


def utility_figure(table: UtilityTable) -> Any:
    """Grouped bars (accuracy, macro-F1) of each training set, the numbers on the bars; a
    set without scores stays in the legend with its reason ("not given")."""
    fig = _figure(width=6.4, height=3.4)
    ax = fig.add_subplot()
    metrics = ("accuracy", "macro-F1")
    width = 0.8 / len(table.rows)
    for i, row in enumerate(table.rows):
        values = [row.accuracy, row.macro_f1]
        label = row.name if row.accuracy is not None else f"{row.name} ({row.note})"
        xs = [m + (i - (len(table.rows) - 1) / 2) * width for m in range(len(metrics))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width=width, label=label,
                      color=_SET_COLOURS.get(row.key))
        ax.bar_label(bars, labels=["" if v is None else f"{v:.3f}" for v in values],
                     fontsize=7, padding=2)
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels(metrics)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("score on the real test data")
    ax.set_title(table.title)
    ax.legend(fontsize=7, loc="upper right")
    return fig


def plot_utility(table: UtilityTable) -> str | None:
    """:func:`utility_figure` as a PNG (base64), or None when no set has a score."""
    if all(r.accuracy is None for r in table.rows):
        return None
    return _png(utility_figure(table))


# -- the page -------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A table for the template's ``table`` macro."""
    return {"header": list(header), "rows": [list(r) for r in rows]}


#: the per-iteration curves drawn lately, by (plot, its rows): the shareable and the operator
#: page of one report draw the same curves from the same stats, and each is drawn once
_CURVES: dict[tuple[str, str], str | None] = {}


def _curve(plot: Any, rows: Sequence[dict[str, Any]]) -> str | None:
    """``plot(rows)`` (a per-iteration curve, base64 PNG), drawn once for equal rows: the
    key is the rows themselves, written out in full."""
    key = (plot.__name__, json.dumps(list(rows), sort_keys=True, default=repr))
    if key not in _CURVES:
        if len(_CURVES) >= 64:
            _CURVES.pop(next(iter(_CURVES)))
        _CURVES[key] = plot(rows)
    return _CURVES[key]


def _plot(b64: str | None, alt: str) -> dict[str, str] | None:
    return {"b64": b64, "alt": alt} if b64 else None


@functools.lru_cache(maxsize=1)
def _templates() -> Any:

    jinja2 = require("jinja2", "eval", "the HTML report's templates (jinja2)")
    return jinja2.Environment(loader=jinja2.PackageLoader("dpsynth.eval", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True)


def noise_sentence(privacy: dict[str, Any]) -> str:
    """How the noise was drawn, from privacy.json (``noise_note`` first, else ``noise``)."""
    note = privacy.get("noise_note")
    if isinstance(note, str) and note.strip():
        return note.strip()
    mode = privacy.get("noise")
    if mode == "seeded":
        return ("The noise was drawn from a seeded generator: the guarantee holds only while "
                "the seed stays secret (anyone who knows the seed can remove the noise).")
    if mode == "secure":
        return "The noise was drawn from the operating system's secure randomness."
    if mode in (None, "none"):
        return ""
    return f"Noise mode: {mode}."


def privacy_statement(privacy: dict[str, Any] | None) -> str:
    """Plain sentences stating the formal guarantee from release/privacy.json, including
    how the noise was drawn (docs/methods.md §0)."""
    if not privacy:
        return "No privacy statement found (release/privacy.json is missing)."
    eps, delta = privacy.get("epsilon"), privacy.get("delta")
    unit = privacy.get("unit", "record")
    noise = noise_sentence(privacy)
    if eps is None:
        protection = privacy.get("secret_protection")
        if isinstance(protection, dict) and protection.get("summary"):
            text = (f"The synthetic data satisfies (p, r)-secret protection "
                    f"({protection['summary']}); this is not differential privacy.")
            return f"{text} {noise}".strip()
        return "release/privacy.json holds no epsilon."
    try:
        eps_f = float(eps)
    except (TypeError, ValueError):
        eps_f = math.nan
    if math.isinf(eps_f):
        return ("This run is NOT differentially private (epsilon = infinity): "
                "no formal privacy guarantee.")
    text = (f"The synthetic data satisfies ({format_epsilon(eps_f)}, {format_delta(delta)})"
            f"-differential privacy at the {unit} level")
    if privacy.get("accountant"):
        text += f", accounted with {privacy['accountant']}"
    target = privacy.get("target_epsilon")
    if target is not None:
        text += f" (target epsilon {format_epsilon(target)})"
    return f"{text}. {noise}".strip()


def _time_like(key: str) -> bool:
    """A summary key that holds a time or a duration (kept off the shareable page)."""
    return any(w in key for w in ("time", "seconds", "started", "finished", "duration",
                                  "created", "ended"))


#: Words for the keys of release/privacy.json, release/summary.json and the mechanisms (the
#: page shows no code name without saying what it is); an unknown key is shown with spaces.
FIELD_WORDS = {
    "epsilon": "epsilon (the guarantee achieved)",
    "delta": "delta",
    "target_epsilon": "target epsilon (asked for)",
    "target_delta": "target delta (asked for)",
    "unit": "privacy unit (record or user)",
    "accountant": "accountant (how the releases are composed)",
    "noise": "noise source",
    "noise_note": "about the noise",
    "releases": "noisy releases",
    "method": "method",
    "noise_multiplier": "noise multiplier (noise std. dev. / sensitivity)",
    "samples": "synthetic samples",
    "requested": "generations requested",
    "sent": "generations sent",
    "dropped": "generations dropped",
    "retried": "generations retried",
    "llm_calls": "language-model calls",
    "llm_requests_sent": "language-model requests sent",
    "http_retries": "HTTP retries",
    "llm_calls_earlier_attempts": "language-model calls of earlier attempts",
    "attempts": "attempts (runs and resumes)",
    "iterations": "iterations",
    "filtered": "candidates filtered out (off-task)",
    "filtered_share": "share of the generations filtered out (off-task)",
    "off_label": "generations refused as another label's text",
    "short": "generations refused as shorter than the length band",
    "off_label_share": "share of the generations refused as another label's text",
    "short_share": "share of the generations refused as shorter than the length band",
    "rho": "zCDP rho (the release's privacy cost)",
    "mu": "GDP mu",
    "grid": "noise grid step",
    "shifts": "largest change one record makes (grid steps)",
    "label_counts": "label counts",
    "votes": "votes",
    "topq_votes": "top-Q votes",
    "label_domain": "label values (discovered)",
    "length_histogram": "length histogram",
    "label_length_histogram": "label x length histogram",
    "discrete_gaussian": "discrete Gaussian",
    "gaussian": "Gaussian",
}


def field_words(key: str) -> str:
    """What the reader sees for a JSON key: its words, else the key with spaces."""
    return FIELD_WORDS.get(key, key.replace("_", " "))


def _scalar_rows(obj: dict[str, Any] | None) -> list[list[Any]]:
    """(key, value) rows of the scalar fields of ``obj``: floats at four significant digits at
    most, lists joined."""
    rows = []
    for key, value in (obj or {}).items():
        if isinstance(value, float):
            rows.append([key, _cell(value)])
        elif isinstance(value, str | int | bool) or value is None:
            rows.append([key, value])
        elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            rows.append([key, ", ".join(str(_cell(v)) for v in value)])
    return rows


def _fidelity_table(ev: dict[str, Any]) -> dict[str, Any]:
    fid = ev.get("fidelity") or {}
    rows = []
    for key in ("synthetic", "zero_shot"):
        block, name = fid.get(key), SET_NAMES[key]
        if not isinstance(block, dict) or is_unavailable(block):
            if block is not None:
                rows.append([name, fmt_metric(block), "", "", "", "", ""])
            continue
        length = block.get("length")
        label_tv = {c: v.get("tv") if isinstance(v, dict) and not is_unavailable(v) else v
                    for c, v in (block.get("labels") or {}).items()}
        rows.append([
            name, block.get("n"), fmt_metric(block.get("fid")), fmt_metric(block.get("precision")),
            fmt_metric(block.get("recall")), fmt_metric(block.get("mauve")),
            fmt_metric(length.get("tv") if isinstance(length, dict) and "tv" in length
                       else length)
            + "".join(f"; {c} TV {fmt_metric(v)}" for c, v in label_tv.items()),
        ])
    return _table(["set", "n", "FID", "precision", "recall", "MAUVE",
                   "length / label TV"], rows)


MECHANISM_COLUMNS = (("name", "release"), ("mechanism", "mechanism"), ("count", "times"),
                     ("sigma", "noise sigma"), ("sensitivity", "sensitivity"),
                     ("sampling_rate", "sampling rate"), ("mu", "GDP mu"))


def _cell(value: Any) -> Any:
    """A table cell: a float at four significant digits at most, a code name in words."""
    if isinstance(value, float):
        return fmt_number(value, 0) if math.isfinite(value) and abs(value) >= 1e4 \
            else f"{value:.4g}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)[:120]
    if isinstance(value, str) and value in FIELD_WORDS:
        return FIELD_WORDS[value]
    return "-" if value is None else value


def mechanisms_table(mechanisms: Any) -> dict[str, Any] | None:
    """release/privacy.json's mechanisms as a table: the usual keys as named columns (in
    order), any others in one last column."""
    if not isinstance(mechanisms, list) or not mechanisms:
        return None
    rows_in = [m for m in mechanisms if isinstance(m, dict)]
    named = [(k, title) for k, title in MECHANISM_COLUMNS if any(k in m for m in rows_in)]
    known = {k for k, _ in MECHANISM_COLUMNS}
    others = any(set(m) - known for m in rows_in)
    rows = []
    for m in rows_in:
        row = [_cell(m.get(k)) for k, _ in named]
        if others:
            row.append("; ".join(f"{FIELD_WORDS.get(k, k)} {_cell(v)}" for k, v in m.items()
                                 if k not in known) or "-")
        rows.append(row)
    return _table([title for _, title in named] + (["other parameters"] if others else []),
                  rows)


METHOD_NAMES = {"aug_pe": "Aug-PE", "wasp": "WASP", "secpe": "SecPE",
                "zero_shot": "Zero-shot", "synrag": "DP-SynRAG"}


def headline(release: RunRelease, ev: dict[str, Any] | None, *, operator: bool = False
             ) -> dict[str, Any]:
    """The box at the top: method, the guarantee in one sentence, samples and, when an
    evaluation exists, the scores in context (:func:`context_table`)."""
    privacy = release.privacy or {}
    context = in_context((ev or {}).get("utility"), operator=operator,
                         majority=_majority_from(ev)) if ev else []
    facts = [("method", METHOD_NAMES.get(release.method, release.method)),
             ("synthetic samples", f"{len(release.synthetic):,}"),
             ("epsilon", format_epsilon(privacy.get("epsilon"))),
             ("delta", format_delta(privacy.get("delta"))),
             ("unit", str(privacy.get("unit", "-")))]
    if privacy.get("noise"):
        facts.append(("noise", str(privacy["noise"])))
    return {"title": f"{METHOD_NAMES.get(release.method, release.method)}: "
                     f"{len(release.synthetic):,} synthetic samples",
            "guarantee": guarantee_sentence(privacy),
            "facts": facts,
            "verdict": report_verdict(ev) if ev and not context else None,
            **context_table(context, operator)}


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %" if abs(share) < 10 else "over 1000 %"


def context_table(rows: Sequence[InContext], operator: bool) -> dict[str, Any]:
    """The headline's numbers in context: per classifier and label column, the synthetic
    accuracy beside zero-shot and the majority-class rate (and, for the operator, the
    real-trained accuracy and the share of the zero-shot -> real gap closed), with one
    sentence each worded from the 95 % interval."""
    if not rows:
        return {"context": None, "sentences": []}
    several = len({r.kind for r in rows}) > 1
    header = ["label column", *(["classifier"] if several else []), "synthetic", "zero-shot",
              "majority class"]
    if operator:
        header += ["real-trained", "gap closed"]
    body, sentences = [], []
    for r in rows:
        cells = [r.column, *([KIND_NAMES.get(r.kind, r.kind)] if several else []),
                 fmt_metric(r.synthetic), fmt_metric(r.zero_shot), fmt_metric(r.majority)]
        if operator:
            cells += [fmt_metric(r.real), "-" if r.gap_closed is None else _pct(r.gap_closed)]
        body.append(cells)
        where = f"{r.column}" + (f" ({KIND_NAMES.get(r.kind, r.kind)})" if several else "")
        text = f"{where}: {r.sentence}"
        if r.majority is not None and r.synthetic <= r.majority:
            text += "; the synthetic classifier does no better than always answering the " \
                    "majority class"
        if operator and r.gap_closed is not None:
            text += f"; it closed {_pct(r.gap_closed)} of the gap between zero-shot and " \
                    "real-trained"
        if operator and r.size_sentence:
            text += f"; {r.size_sentence}"
        sentences.append(text + ".")
    return {"context": _table(header, body), "sentences": sentences}


def report_verdict(ev: dict[str, Any]) -> str:
    """eval.json's one-line verdict, recomputed from its utility block (an older eval.json is
    worded from the interval too) with the classifiers named in words."""
    if not isinstance(ev.get("utility"), dict):
        return str(ev.get("verdict") or "")
    text = verdict(versus_zero_shot(ev["utility"]))
    for key, words in KIND_NAMES.items():
        text = text.replace(f" ({key})", f" ({words})")
    return text


def _majority_from(ev: dict[str, Any] | None) -> Any:
    """The majority-class rate of a label column read from eval.json's (public) test file,
    for an eval.json without it."""

    test_file = (ev or {}).get("test_file")
    if not test_file or not Path(str(test_file)).is_file():
        return None
    return lambda column: majority_share_of_file(str(test_file), column)


#: Below this many texts (synthetic or test) the distribution metrics are rough.
SMALL_N = 500


def small_n_caveat(ev: dict[str, Any]) -> str | None:
    """A caveat when the evaluation compares small sets: FID, precision/recall and MAUVE
    are estimated from few texts (MAUVE quantises them into few clusters and reaches 1.0 on
    tiny sets)."""
    n = ev.get("n") or {}
    sizes = {k: n.get(k) for k in ("synthetic", "test") if isinstance(n.get(k), int)}
    if not sizes or min(sizes.values()) >= SMALL_N:
        return None
    shown = " and ".join(f"{v:,} {k}" for k, v in sizes.items())
    return (f"Small samples ({shown} texts): FID, precision, recall and MAUVE are rough "
            f"estimates below about {SMALL_N} texts, and MAUVE in particular can read 1.000 "
            "on tiny sets. Compare them with the zero-shot row of the same evaluation rather "
            "than read them alone; accuracies carry a sampling error of several points.")


#: Training sets whose test-set scores depend on release/ and public data only.
SHAREABLE_TRAIN_SETS: tuple[str, ...] = ("synthetic", "zero_shot")
OPERATOR_BANNER = ("OPERATOR ONLY - DO NOT SHARE. This page holds values computed on the "
                   "private data (real-trained reference, DCR, membership inference, PII "
                   "and canary audits); they are not covered by the privacy guarantee.")
OPERATOR_REPORT = "report-operator.html"
KIND_HEADINGS = {"logreg": "Logistic regression on sentence embeddings",
                 "finetune": "Fine-tuned MiniLM classifier"}


def _utility_sections(ev: dict[str, Any], operator: bool) -> list[dict[str, Any]]:
    """Per classifier: one table and bar chart per label column (synthetic vs zero-shot vs
    chance, plus the real-trained reference when ``operator``)."""
    sections: dict[str, dict[str, Any]] = {}
    for t in utility_tables(ev.get("utility"), operator=operator):
        rows = [[r.name, fmt_metric(r.accuracy) if r.accuracy is not None else r.note,
                 fmt_metric(r.macro_f1) if r.macro_f1 is not None else ""] for r in t.rows]
        section = sections.setdefault(t.kind, {"title": KIND_HEADINGS.get(t.kind, t.kind),
                                               "tables": []})
        section["tables"].append({
            **_table(["trained on", "accuracy", "macro-F1"], rows), "column": t.column,
            "plot": _plot(plot_utility(t), f"utility {t.kind} {t.column}"),
        })
    return list(sections.values())


def _next_token_table(ev: dict[str, Any], operator: bool) -> dict[str, Any] | None:
    cells = (ev.get("utility") or {}).get("next_token")
    if not isinstance(cells, dict):
        return None
    names = SHAREABLE_TRAIN_SETS + (("private",) if operator else ())
    rows = []
    for name, cell in cells.items():
        if name in names:
            acc = cell.get("accuracy") if isinstance(cell, dict) and "accuracy" in cell else cell
            rows.append([SET_NAMES.get(name, name), fmt_metric(acc)])
    return _table(["trained on", "accuracy"], rows)


def _audit_parts(audit: dict[str, Any] | None, canary: dict[str, Any] | None
                 ) -> list[dict[str, Any]]:
    """Audit sections for the template: a title, a text or a table each."""
    parts: list[dict[str, Any]] = []
    audit = audit or {}
    dcr = audit.get("dcr")
    if isinstance(dcr, dict):
        if is_unavailable(dcr):
            parts.append({"text": f"DCR: {fmt_metric(dcr)}"})
        else:
            parts.append({"title": "Distance to closest record", **_table(
                ["median to private", "median to holdout", "gap", "share closer to private",
                 "one-sided p", "near copies (private / holdout)"],
                [[fmt_metric(dcr["median_private"]), fmt_metric(dcr["median_holdout"]),
                  fmt_metric(dcr["gap"], 4), fmt_metric(dcr["share_closer_to_private"]),
                  fmt_metric(dcr["p_value"], 4),
                  f"{dcr['near_copies_private']} / {dcr['near_copies_holdout']}"]])})
    mia = audit.get("membership_inference")
    if isinstance(mia, dict):
        if is_unavailable(mia):
            parts.append({"text": f"Membership inference: {fmt_metric(mia)}"})
        else:
            tprs = mia.get("tpr_at_fpr") or {}
            parts.append({"title": "Membership inference (distance-based)", **_table(
                ["AUC", *[f"TPR @ FPR {k}" for k in tprs], "members", "non-members"],
                [[fmt_metric(mia["auc"]), *[fmt_metric(v) for v in tprs.values()],
                  mia.get("n_members"), mia.get("n_non_members")]])})
    pii = audit.get("pii")
    if isinstance(pii, dict):
        rows = [[kind, pii[kind]["detected"], pii[kind]["leaked"], pii[kind]["records_with_leak"]]
                for kind in ("email", "phone", "name") if isinstance(pii.get(kind), dict)]
        parts.append({"title": "PII leakage", **_table(
            ["kind", "distinct values detected in output", "of which in private data",
             "output records with a leak"], rows)})
    control = audit.get("zero_shot_control")
    if isinstance(control, dict):
        c_dcr, c_mia = control.get("dcr"), control.get("membership_inference")
        parts.append({"title": "Control: zero-shot data (no private data seen)", **_table(
            ["DCR gap", "DCR p", "MIA AUC"],
            [[fmt_metric(c_dcr.get("gap") if isinstance(c_dcr, dict) and "gap" in c_dcr
                         else c_dcr, 4),
              fmt_metric(c_dcr.get("p_value") if isinstance(c_dcr, dict) and "p_value" in c_dcr
                         else None, 4),
              fmt_metric(c_mia.get("auc") if isinstance(c_mia, dict) and "auc" in c_mia
                         else c_mia)]])})
    if canary:
        hits = canary.get("synthetic") or {}
        control_hits = canary.get("zero_shot") or {}
        parts.append({"title": "Canary audit", **_table(
            ["copies inserted", "exact hits", "near hits", "zero-shot exact / near", "outputs"],
            [[canary.get("copies"), hits.get("exact"), hits.get("near"),
              f"{control_hits.get('exact', '-')} / {control_hits.get('near', '-')}",
              hits.get("outputs")]])})
    return [{"title": None, "text": None, "header": None, "rows": [], **p} for p in parts]


def _read_optional_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def read_eval(release: RunRelease, *, operator: bool) -> dict[str, Any] | None:
    """eval/eval.json; for the operator with private/eval/reference.json merged back in."""
    from .suite import REFERENCE_FILE, merge_private

    ev = _read_optional_json(release.eval_dir / "eval.json")
    if ev is None or not operator:
        return ev
    return merge_private(ev, _read_optional_json(release.audit_dir / REFERENCE_FILE))


def _fid_rows(ev: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per-iteration FID rows from eval.json (computed by `dpsynth eval --test`)."""
    rows = ((ev or {}).get("fidelity") or {}).get("per_iteration") or []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("fid"), int | float)]


def _is_private_note(note: Any) -> bool:
    from .suite import PRIVATE_USE_NOTE

    return note == PRIVATE_USE_NOTE


def _label_plots(release: RunRelease, ev: dict[str, Any] | None) -> list[dict[str, str] | None]:
    real_dists: dict[str, dict[str, float]] = {}
    for col, block in (((ev or {}).get("fidelity") or {}).get("synthetic") or {}).get(
            "labels", {}).items():
        if isinstance(block, dict) and isinstance(block.get("real"), dict):
            real_dists[col] = block["real"]
    plots = []
    for col, values in release.synthetic.labels.items():
        counts = Counter(values)
        total = sum(counts.values()) or 1
        shares = {k: v / total for k, v in sorted(counts.items())}
        plots.append(_plot(plot_labels(col, shares, real_dists.get(col)),
                           f"label distribution {col}"))
    return plots


#: Label values given their own rows in the sample table (the rest are counted below it).
MAX_SAMPLE_LABELS = 100
#: Above this many label values the sample table shows one sample of each.
FEW_LABELS = 25
#: A sample longer than this is cut (with "...") in the sample table.
SAMPLE_CHARS = 600


def _clip(text: str) -> str:
    return text if len(text) <= SAMPLE_CHARS else text[:SAMPLE_CHARS].rstrip() + " ..."


def sample_table(release: RunRelease, per_label: int = 2) -> dict[str, Any]:
    """A few released samples of every label value of the first label column, the first
    ``per_label`` of each in file order (release/synthetic.jsonl is public); without labels,
    the first few samples."""
    syn = release.synthetic
    if not syn.labels:
        rows = [["-", _clip(t)] for t in syn.texts[:max(per_label, 5)]]
        return {"samples": _table(["labels", "text"], rows), "samples_note": None}
    column = next(iter(syn.labels))
    picked: dict[str, list[int]] = {}
    for i, value in enumerate(syn.labels[column]):
        chosen = picked.setdefault(value, [])
        if len(chosen) < per_label:
            chosen.append(i)
    values = sorted(picked, key=lambda v: picked[v][0])
    shown = values[:MAX_SAMPLE_LABELS]
    if len(values) > FEW_LABELS:
        per_label = 1
        picked = {v: picked[v][:1] for v in shown}
    rows = [[", ".join(f"{c} = {v[i]}" for c, v in syn.labels.items()), _clip(syn.texts[i])]
            for value in shown for i in picked[value]]
    note = (f"Up to {per_label} samples of each of the {len(shown)} {column} values that have "
            f"samples" + (f" (of {len(values)}; the others are left out)"
                          if len(values) > len(shown) else "")
            + ", the first of each in release/synthetic.jsonl.")
    return {"samples": _table(["labels", "text"], rows), "samples_note": note}


def render_report(release: RunRelease, n_samples: int = 2, *, operator: bool = False) -> str:
    """The report's HTML (one string, no external resources), from the Jinja2 template
    ``templates/report.html.j2`` with autoescaping.

    ``operator=False`` (the default): the shareable page, built from release/, stats.jsonl,
    public test-set evaluations of the released sets and privacy.json only.
    ``operator=True``: the same page plus everything computed on the private data, under an
    "operator only - do not share" banner (docs/methods.md §5). ``n_samples``: samples shown
    per label value."""
    ev = read_eval(release, operator=operator)
    meta = release.meta
    privacy = release.privacy or {}
    mechs = privacy.get("mechanisms")
    curves = [
        _plot(_curve(plot_kept, release.stats), "kept samples per iteration"),
        _plot(_curve(plot_votes, release.stats), "vote mass vs noise scale"),
        _plot(_curve(plot_fid, release.stats) or _curve(plot_fid, _fid_rows(ev)),
              "FID per iteration"),
        _plot(_curve(plot_generator_weights, release.stats), "generator weights"),
        _plot(_curve(plot_filtered, release.stats), "generated texts filtered out as off-task"),
    ]
    context: dict[str, Any] = {
        "kind": "operator-only report" if operator else "shareable report",
        "run_id": release.run_id,
        "operator": operator,
        "banner": OPERATOR_BANNER,
        "operator_report": OPERATOR_REPORT,
        "headline": headline(release, ev, operator=operator),

        "statement": privacy_statement(release.privacy),
        "privacy_table": _table(["field", "value"], [
            [field_words(k), format_epsilon(privacy[k]) if k in ("epsilon", "target_epsilon")
             else METHOD_NAMES.get(str(v), v) if k == "method" else v]
            for k, v in _scalar_rows(privacy)]) if privacy else None,
        "mechanisms": mechanisms_table(mechs),
        "summary_table": _table(["field", "value"], [
            ["run", release.run_id], ["status", meta.get("status", "-")],
            *([field_words(k), format_epsilon(release.summary[k]) if k == "epsilon"
               else format_delta(release.summary[k]) if k == "delta" else v]
              for k, v in _scalar_rows(release.summary)
              if not _time_like(k) and k != "method")]),
        "curves": [c for c in curves if c],
        "filtered_caveat": filtered_caveat(release.stats),
        "cut_caveat": cut_caveat(release.synthetic.texts),
        "label_plots": [p for p in _label_plots(release, ev) if p],
        "evaluated": bool(ev),
        **sample_table(release, n_samples),
        "audits": _audit_parts(
            _read_optional_json(release.audit_dir / "audit.json"),
            _read_optional_json(release.audit_dir / "audit_canary.json"),
        ) if operator else [],
        "source": "release/, stats.jsonl and eval/ (including the evaluator's private-data "
        "results)" if operator else "release/, stats.jsonl and public test-set evaluations only",
    }
    if ev:
        context.update(
            test_file=Path(str(ev.get("test_file"))).name,
            embedder=ev.get("embedder"),
            verdict=report_verdict(ev),
            caveat=small_n_caveat(ev),
            fidelity_table=_fidelity_table(ev),
            utility=_utility_sections(ev, operator),
            chance_note="chance: always predicting the test split's most frequent label "
            "(accuracy = its share; macro-F1 = its F1 / number of test classes)."
            + ("" if operator else " The real-trained reference is in the operator's report."),
            next_token=_next_token_table(ev, operator),
            notes=[n for n in ev.get("notes", []) if operator or not _is_private_note(n)],
        )
    return _templates().get_template("report.html.j2").render(context)


def write_report(run_dir: str | Path, out: str | Path | None = None, *,
                 operator_out: str | Path | None = None) -> Path:
    """Render the shareable report of ``run_dir`` to ``out`` (default RUN_DIR/eval/report.html)
    and the operator-only report to ``operator_out`` (default
    RUN_DIR/private/report-operator.html, mode 0600); returns the shareable path."""
    release = load_run(run_dir)
    target = Path(out) if out else release.eval_dir / "report.html"
    atomic_write_text(target, render_report(release), mode=SHARED_MODE)
    private = Path(operator_out) if operator_out else release.root / "private" / OPERATOR_REPORT
    if not operator_out:
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_text(private, render_report(release, operator=True), mode=0o600)
    return target


def operator_report_path(run_dir: str | Path) -> Path:
    """Where :func:`write_report` puts the operator-only page by default."""
    return Path(run_dir) / "private" / OPERATOR_REPORT


# -- comparison across runs -----------------------------------------------------------------


def _value(v: Any) -> Any:
    return None if v is None or is_unavailable(v) else v


def compare_runs(run_dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One row per run: method, epsilon, samples, FID, MAUVE and synthetic-trained accuracy."""
    rows = []
    for run_dir in run_dirs:
        try:
            release = load_run(run_dir)
        except EvalInputError as err:
            rows.append({"run_dir": str(run_dir), "error": str(err)})
            continue
        ev = _read_optional_json(release.eval_dir / "eval.json") or {}
        audit = _read_optional_json(release.audit_dir / "audit.json") or {}
        syn = (ev.get("fidelity") or {}).get("synthetic") or {}
        acc: dict[str, Any] = {}
        for kind in ("logreg", "finetune"):
            for col, row in ((ev.get("utility") or {}).get(kind) or {}).items():
                cell = row.get("synthetic")
                if isinstance(cell, dict) and "accuracy" in cell:
                    acc[f"{kind}:{col}"] = cell["accuracy"]
        mia = audit.get("membership_inference")
        rows.append({
            "run_dir": str(run_dir),
            "run_id": release.run_id,
            "method": release.method,
            "epsilon": (release.privacy or {}).get("epsilon"),
            "delta": (release.privacy or {}).get("delta"),
            "unit": (release.privacy or {}).get("unit"),
            "samples": len(release.synthetic),
            "fid": _value(syn.get("fid")),
            "mauve": _value(syn.get("mauve")),
            "accuracy": acc,
            "mia_auc": mia.get("auc") if isinstance(mia, dict) else None,
            "evaluated": bool(ev),
        })
    return rows
