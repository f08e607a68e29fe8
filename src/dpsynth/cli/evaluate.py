"""CLI commands: ``dpsynth eval``, ``dpsynth report`` and ``dpsynth compare``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def evaluate(
    run_dir: Annotated[Path, typer.Argument(help="run folder written by dpsynth generate")],
    test: Annotated[Path | None, typer.Option(
        "--test", help="real test data (.csv/.jsonl/.parquet); default for demo runs: the "
        "demo corpus's test split")] = None,
    text: Annotated[str | None, typer.Option("--text", help="text column of the test file "
                                             "(default: the run config's)")] = None,
    label: Annotated[list[str] | None, typer.Option(
        "--label", help="label column (repeat; default: the run config's)")] = None,
    classifier: Annotated[str, typer.Option(
        "--classifier", help="logreg (default), finetune or both")] = "logreg",
    epochs: Annotated[int, typer.Option("--epochs", min=1, help="fine-tuning epochs")] = 3,
    k: Annotated[int, typer.Option("--k", min=1, help="k of kNN precision/recall")] = 3,
    mauve: Annotated[bool, typer.Option("--mauve/--no-mauve", help="compute MAUVE")] = True,
    audits: Annotated[bool, typer.Option("--audits/--no-audits",
                                         help="DCR, membership inference, PII")] = True,
    pii_column: Annotated[list[str] | None, typer.Option(
        "--pii-column", help="private column holding PII values (repeat; default: columns "
        "named like name/phone/email)")] = None,
    zero_shot: Annotated[Path | None, typer.Option(
        "--zero-shot", help="zero-shot run folder to use as the zero-shot reference "
        "(default: the run's own zero-shot set in release/)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print only JSON on stdout")] = False,
) -> None:
    """Fidelity, utility and audits of a run against real test data; writes RUN_DIR/eval/."""
    from rich.console import Console

    from ..eval.suite import EvalOptions, evaluate_run

    err = Console(stderr=True)
    options = EvalOptions(
        text=text, labels=label or None, classifier=classifier,  # type: ignore[arg-type]
        k=k, finetune_epochs=epochs, with_mauve=mauve, with_audits=audits,
        pii_columns=pii_column or None, zero_shot_run=zero_shot)
    result, audit = evaluate_run(
        run_dir, test, options, log=None if as_json else (lambda m: err.print(f"[dim]{m}[/dim]")))
    if as_json:
        typer.echo(json.dumps({"eval": result, "audit": audit}, default=str))
        return
    print_eval(result, audit)
    private = Path(run_dir) / "private" / "eval"
    Console().print(f"written: {Path(run_dir) / 'eval' / 'eval.json'}, {private}/"
                    + ("{reference,audit}.json" if audit else "reference.json"))
    typer.echo(result.get("verdict", ""))


def print_eval(result: dict[str, Any], audit: dict[str, Any] | None) -> None:
    """Rich tables for an eval result: fidelity; per label column synthetic vs zero-shot vs
    real-trained vs chance (the CLI is the operator's view); audits."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..eval.common import fmt_metric, is_unavailable
    from ..eval.view import in_context, utility_tables

    console = Console()
    from ..statement import format_epsilon

    eps_text = format_epsilon(result.get("epsilon"))
    fid = Table(title=f"Fidelity vs real test ({result['method']}, epsilon {eps_text})")
    for col in ("set", "n", "FID", "precision", "recall", "MAUVE", "length TV"):
        fid.add_column(col)
    for name in ("synthetic", "zero_shot"):
        block = result["fidelity"].get(name)
        if not isinstance(block, dict) or is_unavailable(block):
            fid.add_row(name, "", escape(fmt_metric(block)))
            continue
        length = block.get("length")
        fid.add_row(name, str(block["n"]), *(escape(fmt_metric(block.get(m))) for m in
                                             ("fid", "precision", "recall", "mauve")),
                    escape(fmt_metric(length.get("tv") if isinstance(length, dict)
                                      and "tv" in length else length)))
    console.print(fid)
    util = result["utility"]
    for view in utility_tables(util, operator=True):
        table = Table(title=f"Utility: {view.title}",
                      caption="trained on each set, tested on the real test data")
        for col in ("trained on", "accuracy", "macro-F1"):
            table.add_column(col)
        for row in view.rows:
            table.add_row(row.name,
                          fmt_metric(row.accuracy) if row.accuracy is not None
                          else escape(row.note),
                          fmt_metric(row.macro_f1) if row.macro_f1 is not None else "")
        console.print(table)
    for line in in_context(util, operator=True):
        gap = "" if line.gap_closed is None else \
            f"; {100 * line.gap_closed:.0f} % of the zero-shot -> real-trained gap closed"
        size = f"; {line.size_sentence}" if line.size_sentence else ""
        console.print(escape(f"{line.column} ({line.kind}): {line.sentence}{gap}{size}"))
    if "next_token" in util:
        table = Table(title="Utility: next-token accuracy (word bigram LM) on real test text")
        table.add_column("trained on")
        table.add_column("accuracy")
        for name, cell in util["next_token"].items():
            acc = cell.get("accuracy") if isinstance(cell, dict) and "accuracy" in cell else cell
            table.add_row(name, escape(fmt_metric(acc)))
        console.print(table)
    if audit:
        print_audit(audit)
    for note in result.get("notes", []):
        console.print(f"[dim]note: {escape(note)}[/dim]")


def print_audit(audit: dict[str, Any]) -> None:
    """Rich table of an audit result (DCR, membership inference, PII)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..eval.common import fmt_metric

    console = Console()
    table = Table(title="Privacy audits (empirical; cannot prove absence of leakage)")
    table.add_column("audit")
    table.add_column("result")
    dcr, mia, pii = audit.get("dcr"), audit.get("membership_inference"), audit.get("pii")
    if isinstance(dcr, dict) and "gap" in dcr:
        table.add_row("DCR gap (holdout - private median)",
                      f"{dcr['gap']:.4f} (one-sided p {dcr['p_value']:.3g}; near copies "
                      f"{dcr['near_copies_private']} private / {dcr['near_copies_holdout']} "
                      "holdout)")
    else:
        table.add_row("DCR", escape(fmt_metric(dcr)))
    if isinstance(mia, dict) and "auc" in mia:
        tprs = ", ".join(f"TPR@{a}={fmt_metric(v)}" for a, v in mia["tpr_at_fpr"].items())
        table.add_row("membership inference AUC", escape(f"{mia['auc']:.3f} ({tprs})"))
    else:
        table.add_row("membership inference", escape(fmt_metric(mia)))
    if isinstance(pii, dict):
        table.add_row("PII leaked (email / phone / name)",
                      f"{pii['email']['leaked']} / {pii['phone']['leaked']} / "
                      f"{pii['name']['leaked']} distinct values in "
                      f"{pii['records_with_any_leak']} of {pii['n_outputs']} records")
    console.print(table)


def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    test: Annotated[Path | None, typer.Option(
        "--test", help="evaluate against this test file first (writes eval/eval.json)")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="HTML file to write (default RUN_DIR/eval/report.html)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print only JSON on stdout")] = False,
) -> None:
    """Write one self-contained HTML report (plots inlined) from release/, stats and eval/."""
    from ..eval.report import operator_report_path, write_report

    if test is not None:
        from ..eval.suite import evaluate_run

        evaluate_run(run_dir, test)
    path = write_report(run_dir, out)
    if as_json:
        typer.echo(json.dumps({"report": str(path),
                               "operator_report": str(operator_report_path(run_dir))}))
    else:
        typer.echo(f"report written: {path} (shareable); operator-only report: "
                   f"{operator_report_path(run_dir)}")


def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="run folders")],
    as_json: Annotated[bool, typer.Option("--json", help="print only JSON on stdout")] = False,
) -> None:
    """One table across runs: method, guarantee (epsilon, delta, unit), samples, FID, MAUVE,
    accuracies. A folder that is not a finished run is named on stderr and the exit code is 2
    (the other runs are still shown)."""
    from rich.console import Console
    from rich.table import Table

    from ..eval.common import fmt_metric
    from ..eval.report import compare_runs
    from ..statement import format_delta, format_epsilon

    rows = compare_runs(run_dirs)
    bad = [r for r in rows if "error" in r]
    if as_json:
        typer.echo(json.dumps(rows, default=str))
    else:
        good = [r for r in rows if "error" not in r]
        acc_cols = sorted({c for r in good for c in r.get("accuracy", {})})
        if good:
            table = Table(title="dpsynth runs")
            table.add_column("run", overflow="fold", min_width=min(
                40, max(len(r["run_dir"]) for r in good)))
            for col in ("method", "epsilon", "delta", "unit", "samples", "FID", "MAUVE",
                        *acc_cols, "MIA AUC"):
                table.add_column(col, overflow="fold")
            for r in good:
                table.add_row(
                    r["run_dir"], r["method"], format_epsilon(r["epsilon"]),
                    format_delta(r.get("delta")), str(r.get("unit") or "-"), str(r["samples"]),
                    fmt_metric(r["fid"]), fmt_metric(r["mauve"]),
                    *(fmt_metric(r["accuracy"].get(c)) for c in acc_cols),
                    fmt_metric(r["mia_auc"]))
            Console(soft_wrap=False).print(table)
    for r in bad:
        typer.echo(f"error: {r['error']}", err=True)
    if bad:
        raise typer.Exit(2)


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.command("eval")(evaluate)
    root.command("report")(report)
    root.command("compare")(compare)
