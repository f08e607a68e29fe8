"""The run report: a shareable HTML page, an operator-only page, and a comparison table.

Two pages per run (docs/methods.md §5 evaluation, §6 threat model):

* the **shareable** report (default ``RUN_DIR/eval/report.html``) holds only values computed
  from ``release/`` and public inputs: the privacy statement (with its noise mode), the
  release summary, ``stats.jsonl`` curves, synthetic samples and label shares, and the
  evaluations of the released sets (synthetic, zero-shot) on the public test data;
* the **operator-only** report (``RUN_DIR/private/report-operator.html``, mode 0600) adds
  everything computed on the private data: the private-trained reference classifier, DCR,
  membership inference, PII and canary audits. It is marked "operator only - do not share".

Neither page opens the private data file; the operator page reads the evaluator's own
``eval/*.json`` results. Plots are matplotlib PNGs inlined as base64 data URIs; a
Content-Security-Policy forbids any external load.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..runs import atomic_write_text
from .common import EvalInputError, fmt_metric, is_unavailable
from .rundata import RunRelease, load_run

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


def _img(b64: str, alt: str) -> str:
    return f'<img src="data:image/png;base64,{b64}" alt="{html.escape(alt)}">'


def _series(stats: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(stats):
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(float(row.get("iteration", i)))
            ys.append(float(value))
    return xs, ys


def plot_kept(stats: Sequence[dict[str, Any]]) -> str | None:
    """Kept samples (and candidates) per iteration."""
    kx, ky = _series(stats, "kept")
    cx, cy = _series(stats, "candidates")
    if not ky and not cy:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    if ky:
        ax.plot(kx, ky, marker="o", label="kept samples")
    if cy:
        ax.plot(cx, cy, marker="s", linestyle="--", label="candidates")
    ax.set_xlabel("iteration")
    ax.set_ylabel("count")
    ax.set_title("Samples per iteration")
    ax.legend()
    return _png(fig)


def plot_votes(stats: Sequence[dict[str, Any]]) -> str | None:
    """Total vote mass against the Gaussian noise scale per iteration."""
    vx, vy = _series(stats, "vote_mass")
    nx, ny = _series(stats, "noise_sigma")
    if not vy and not ny:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    if vy:
        ax.plot(vx, vy, marker="o", label="vote mass")
    if ny:
        ax.plot(nx, ny, marker="s", linestyle="--", label="noise sigma")
    ax.set_xlabel("iteration")
    ax.set_title("Vote mass vs noise scale")
    ax.legend()
    return _png(fig)


def plot_fid(stats: Sequence[dict[str, Any]]) -> str | None:
    fx, fy = _series(stats, "fid")
    if not fy:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(fx, fy, marker="o", color="tab:red")
    ax.set_xlabel("iteration")
    ax.set_ylabel("FID (lower is closer)")
    ax.set_title("FID per iteration")
    return _png(fig)


def plot_generator_weights(stats: Sequence[dict[str, Any]]) -> str | None:
    """WASP: each generator's weight per iteration."""
    rows = [r for r in stats if isinstance(r.get("generator_weights"), dict)]
    if not rows:
        return None
    names = sorted({name for r in rows for name in r["generator_weights"]})
    fig = _figure()
    ax = fig.add_subplot()
    for name in names:
        xs = [float(r.get("iteration", i)) for i, r in enumerate(rows)]
        ys = [float(r["generator_weights"].get(name, 0.0)) for r in rows]
        ax.plot(xs, ys, marker="o", label=name)
    ax.set_xlabel("iteration")
    ax.set_ylabel("weight")
    ax.set_ylim(0, 1)
    ax.set_title("Generator weights (WASP)")
    ax.legend()
    return _png(fig)


def plot_labels(column: str, synthetic: dict[str, float], real: dict[str, float] | None
                ) -> str:
    """Label shares: synthetic (release) and, when evaluated, the real test data."""
    keys = sorted(set(synthetic) | set(real or {}))
    fig = _figure(width=max(6.0, 0.5 * len(keys) + 2), height=3.4)
    ax = fig.add_subplot()
    pos = list(range(len(keys)))
    width = 0.4 if real else 0.8
    ax.bar([p - (width / 2 if real else 0) for p in pos], [synthetic.get(k, 0) for k in keys],
           width=width, label="synthetic")
    if real:
        ax.bar([p + width / 2 for p in pos], [real.get(k, 0) for k in keys], width=width,
               label="real test")
    ax.set_xticks(pos)
    ax.set_xticklabels([k[:18] for k in keys], rotation=45 if len(keys) > 5 else 0,
                       ha="right" if len(keys) > 5 else "center")
    ax.set_ylabel("share")
    ax.set_title(f"Label distribution: {column}")
    ax.legend()
    return _png(fig)


# -- HTML pieces ----------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:left;font-size:.92em}th{background:#f3f3f3}.statement{background:#eef6ee;
border-left:4px solid #3a7;padding:.6em 1em}.note{color:#555;font-size:.9em}
.sample{background:#fafafa;border:1px solid #ddd;padding:.5em;margin:.4em 0;white-space:pre-wrap}
img{max-width:100%;display:block;margin:.6em 0}.warn{color:#a40}
.banner{background:#fde8e8;border:2px solid #c22;color:#900;font-weight:bold;padding:.6em 1em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
    text = (f"The synthetic data satisfies ({eps_f:.4g}, {float(delta or 0):.3g})-differential "
            f"privacy at the {unit} level")
    if privacy.get("accountant"):
        text += f", accounted with {privacy['accountant']}"
    target = privacy.get("target_epsilon")
    if target is not None:
        text += f" (target epsilon {target})"
    return f"{text}. {noise}".strip()


def _scalar_rows(obj: dict[str, Any] | None) -> list[list[Any]]:
    rows = []
    for key, value in (obj or {}).items():
        if isinstance(value, str | int | float | bool) or value is None:
            rows.append([key, value])
        elif isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            rows.append([key, ", ".join(map(str, value))])
    return rows


def _fidelity_table(ev: dict[str, Any]) -> str:
    fid = ev.get("fidelity") or {}
    rows = []
    for name in ("synthetic", "zero_shot"):
        block = fid.get(name)
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


#: Training sets whose test-set scores depend on release/ and public data only.
SHAREABLE_TRAIN_SETS: tuple[str, ...] = ("synthetic", "zero_shot")
OPERATOR_BANNER = ("OPERATOR ONLY - DO NOT SHARE. This page holds values computed on the "
                   "private data (private-trained reference, DCR, membership inference, PII "
                   "and canary audits); they are not covered by the privacy guarantee.")
OPERATOR_REPORT = "report-operator.html"


def _utility_tables(ev: dict[str, Any], operator: bool) -> str:
    """Test-set utility of each training set; the private-trained reference only when
    ``operator`` (it is computed on the private data)."""
    util = ev.get("utility") or {}
    names = SHAREABLE_TRAIN_SETS + (("private",) if operator else ())
    parts = []
    titles = {"logreg": "Logistic regression on sentence embeddings",
              "finetune": "Fine-tuned MiniLM classifier"}
    for kind in ("logreg", "finetune"):
        per_col = util.get(kind)
        if not isinstance(per_col, dict):
            continue
        rows = []
        for col, row in per_col.items():
            for name in names:
                cell = row.get(name)
                if isinstance(cell, dict) and not is_unavailable(cell):
                    rows.append([col, name, fmt_metric(cell.get("accuracy")),
                                 fmt_metric(cell.get("macro_f1"))])
                else:
                    rows.append([col, name, fmt_metric(cell), ""])
            rows.append([col, "chance (majority)", fmt_metric(row.get("chance")), ""])
        parts.append(f"<h3>{_e(titles[kind])}</h3>"
                     + _table(["label", "trained on", "accuracy", "macro-F1"], rows))
    if isinstance(util.get("next_token"), dict):
        rows = []
        for name, cell in util["next_token"].items():
            if name not in names:
                continue
            acc = cell.get("accuracy") if isinstance(cell, dict) and "accuracy" in cell else cell
            rows.append([name, fmt_metric(acc)])
        parts.append("<h3>Next-token accuracy (word bigram LM)</h3>"
                     + _table(["trained on", "accuracy"], rows))
    return "".join(parts)


def _audit_tables(audit: dict[str, Any]) -> str:
    parts = []
    dcr = audit.get("dcr")
    if isinstance(dcr, dict):
        if is_unavailable(dcr):
            parts.append(f"<p>DCR: {_e(fmt_metric(dcr))}</p>")
        else:
            parts.append("<h3>Distance to closest record</h3>" + _table(
                ["median to private", "median to holdout", "gap", "share closer to private",
                 "one-sided p", "near copies (private / holdout)"],
                [[fmt_metric(dcr["median_private"]), fmt_metric(dcr["median_holdout"]),
                  fmt_metric(dcr["gap"], 4), fmt_metric(dcr["share_closer_to_private"]),
                  fmt_metric(dcr["p_value"], 4),
                  f"{dcr['near_copies_private']} / {dcr['near_copies_holdout']}"]]))
    mia = audit.get("membership_inference")
    if isinstance(mia, dict):
        if is_unavailable(mia):
            parts.append(f"<p>Membership inference: {_e(fmt_metric(mia))}</p>")
        else:
            tprs = mia.get("tpr_at_fpr") or {}
            parts.append("<h3>Membership inference (distance-based)</h3>" + _table(
                ["AUC", *[f"TPR @ FPR {k}" for k in tprs], "members", "non-members"],
                [[fmt_metric(mia["auc"]), *[fmt_metric(v) for v in tprs.values()],
                  mia.get("n_members"), mia.get("n_non_members")]]))
    pii = audit.get("pii")
    if isinstance(pii, dict):
        rows = [[kind, pii[kind]["detected"], pii[kind]["leaked"], pii[kind]["records_with_leak"]]
                for kind in ("email", "phone", "name") if isinstance(pii.get(kind), dict)]
        parts.append("<h3>PII leakage</h3>" + _table(
            ["kind", "distinct values detected in output", "of which in private data",
             "output records with a leak"], rows))
    control = audit.get("zero_shot_control")
    if isinstance(control, dict):
        c_dcr, c_mia = control.get("dcr"), control.get("membership_inference")
        parts.append("<h3>Control: zero-shot data (no private data seen)</h3>" + _table(
            ["DCR gap", "DCR p", "MIA AUC"],
            [[fmt_metric(c_dcr.get("gap") if isinstance(c_dcr, dict) and "gap" in c_dcr
                         else c_dcr, 4),
              fmt_metric(c_dcr.get("p_value") if isinstance(c_dcr, dict) and "p_value" in c_dcr
                         else None, 4),
              fmt_metric(c_mia.get("auc") if isinstance(c_mia, dict) and "auc" in c_mia
                         else c_mia)]]))
    return "".join(parts)


def _canary_table(canary: dict[str, Any]) -> str:
    hits = canary.get("synthetic") or {}
    control = canary.get("zero_shot") or {}
    return "<h3>Canary audit</h3>" + _table(
        ["copies inserted", "exact hits", "near hits", "zero-shot exact / near", "outputs"],
        [[canary.get("copies"), hits.get("exact"), hits.get("near"),
          f"{control.get('exact', '-')} / {control.get('near', '-')}", hits.get("outputs")]])


def _read_optional_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _fid_rows(ev: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per-iteration FID rows from eval.json (computed by `dpsynth eval --test`)."""
    rows = ((ev or {}).get("fidelity") or {}).get("per_iteration") or []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("fid"), int | float)]


def _is_private_note(note: Any) -> bool:
    from .suite import PRIVATE_USE_NOTE

    return note == PRIVATE_USE_NOTE


def render_report(release: RunRelease, n_samples: int = 5, *, operator: bool = False) -> str:
    """The report's HTML (one string, no external resources).

    ``operator=False`` (the default): the shareable page, built from release/, stats.jsonl,
    public test-set evaluations of the released sets and privacy.json only.
    ``operator=True``: the same page plus everything computed on the private data, under an
    "operator only - do not share" banner (docs/methods.md §5)."""
    ev = _read_optional_json(release.eval_dir / "eval.json")
    audit = _read_optional_json(release.audit_dir / "audit.json") if operator else None
    canary = _read_optional_json(release.audit_dir / "audit_canary.json") if operator else None
    meta = release.meta
    kind = "operator-only report" if operator else "shareable report"
    out: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">",
        f"<title>dpsynth {kind}: {_e(release.run_id)}</title><style>{_CSS}</style></head><body>",
    ]
    if operator:
        out.append(f"<p class='banner' id='operator-only'>{_e(OPERATOR_BANNER)}</p>")
    out += [
        f"<h1>dpsynth run {_e(release.run_id)}</h1>",
        _table(["method", "status", "started", "finished", "synthetic samples"],
               [[release.method, meta.get("status", "-"), meta.get("started", "-"),
                 meta.get("finished", "-"), len(release.synthetic)]]),
        "<h2>Privacy guarantee</h2>",
        f"<p class='statement' id='privacy-statement'>{_e(privacy_statement(release.privacy))}"
        "</p>",
    ]
    if release.privacy:
        out.append(_table(["field", "value"], _scalar_rows(release.privacy)))
        mechs = release.privacy.get("mechanisms")
        if isinstance(mechs, list) and mechs:
            out.append("<p class='note'>Mechanisms: "
                       + _e("; ".join(json.dumps(m, default=str)[:200] for m in mechs[:20]))
                       + "</p>")
    if release.summary:
        out += ["<h2>Summary</h2>", _table(["field", "value"], _scalar_rows(release.summary))]

    out.append("<h2>Per-iteration curves</h2>")
    plots = [
        (plot_kept(release.stats), "kept samples per iteration"),
        (plot_votes(release.stats), "vote mass vs noise scale"),
        (plot_fid(release.stats) or plot_fid(_fid_rows(ev)), "FID per iteration"),
        (plot_generator_weights(release.stats), "generator weights"),
    ]
    drawn = [_img(b64, alt) for b64, alt in plots if b64]
    out += drawn or ["<p class='note'>No per-iteration statistics (stats.jsonl is empty).</p>"]

    out.append("<h2>Label distributions</h2>")
    real_dists: dict[str, dict[str, float]] = {}
    if ev:
        for col, block in ((ev.get("fidelity") or {}).get("synthetic") or {}).get(
                "labels", {}).items():
            if isinstance(block, dict) and isinstance(block.get("real"), dict):
                real_dists[col] = block["real"]
    if release.synthetic.labels:
        for col, values in release.synthetic.labels.items():
            counts = Counter(values)
            total = sum(counts.values()) or 1
            shares = {k: v / total for k, v in sorted(counts.items())}
            out.append(_img(plot_labels(col, shares, real_dists.get(col)),
                            f"label distribution {col}"))
    else:
        out.append("<p class='note'>The synthetic data has no label columns.</p>")

    out.append("<h2>Evaluation</h2>")
    if ev:
        out.append(f"<p class='note'>Test data: {_e(Path(str(ev.get('test_file'))).name)}; "
                   f"embedder: {_e(ev.get('embedder'))}; created {_e(ev.get('created'))}.</p>")
        out += ["<h3>Fidelity against the real test data</h3>", _fidelity_table(ev),
                _utility_tables(ev, operator)]
        for note in ev.get("notes", []):
            if operator or not _is_private_note(note):
                out.append(f"<p class='note'>{_e(note)}</p>")
    else:
        out.append("<p class='note'>Not evaluated yet: run <code>dpsynth eval RUN_DIR --test "
                   "FILE</code> (or <code>dpsynth report RUN_DIR --test FILE</code>).</p>")

    if operator:
        out.append("<h2>Privacy audits</h2>")
        out.append("<p class='note'>Audits are empirical and reported separately from the "
                   "formal guarantee: they can show leakage, they cannot prove its absence.</p>")
        if audit:
            out.append(_audit_tables(audit))
        if canary:
            out.append(_canary_table(canary))
        if not audit and not canary:
            out.append("<p class='note'>No audit results (private/eval/audit.json is missing).</p>")
    else:
        out.append("<p class='note' id='operator-pointer'>Results computed on the private data "
                   "(the private-trained reference, DCR, membership inference, PII and canary "
                   f"audits) are not part of this shareable report; the operator finds them in "
                   f"private/{OPERATOR_REPORT}.</p>")

    out.append(f"<h2>Sample synthetic texts (first {n_samples} of release/synthetic.jsonl)"
               "</h2>")
    for i, text in enumerate(release.synthetic.texts[:n_samples]):
        labels = ", ".join(f"{c}={v[i]}" for c, v in release.synthetic.labels.items())
        out.append(f"<div class='sample'><b>{_e(labels)}</b>\n{_e(text)}</div>")
    source = ("release/, stats.jsonl and eval/ (including the evaluator's private-data results)"
              if operator else "release/, stats.jsonl and public test-set evaluations only")
    out.append(f"<p class='note'>Generated by dpsynth from the run's {source}.</p></body></html>")
    return "\n".join(out)


def write_report(run_dir: str | Path, out: str | Path | None = None, *,
                 operator_out: str | Path | None = None) -> Path:
    """Render the shareable report of ``run_dir`` to ``out`` (default RUN_DIR/eval/report.html)
    and the operator-only report to ``operator_out`` (default
    RUN_DIR/private/report-operator.html, mode 0600); returns the shareable path."""
    release = load_run(run_dir)
    target = Path(out) if out else release.eval_dir / "report.html"
    atomic_write_text(target, render_report(release))
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
            "run_dir": str(release.root),
            "run_id": release.run_id,
            "method": release.method,
            "epsilon": (release.privacy or {}).get("epsilon"),
            "samples": len(release.synthetic),
            "fid": _value(syn.get("fid")),
            "mauve": _value(syn.get("mauve")),
            "accuracy": acc,
            "mia_auc": mia.get("auc") if isinstance(mia, dict) else None,
            "evaluated": bool(ev),
        })
    return rows
