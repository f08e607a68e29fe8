"""CLI commands: ``dpsynth audit canary`` and ``dpsynth audit run``.

Audits are empirical and reported apart from the formal guarantee: they can show leakage,
they cannot prove its absence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .. import progress
from .generate import parse_sets

audit_app = typer.Typer(
    name="audit",
    help="Empirical privacy audits: canaries, distance to closest record, membership "
    "inference, PII leakage.",
    no_args_is_help=True,
)


@audit_app.command("canary")
def canary(
    config: Annotated[Path, typer.Argument(help="run configuration (YAML)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="audit folder")],
    copies: Annotated[int, typer.Option("--copies", min=1,
                                        help="private records that get the canary")] = 10,
    canary_text: Annotated[str | None, typer.Option("--canary", help="secret string to plant"
                                                    )] = None,
    threshold: Annotated[float, typer.Option("--threshold", min=0.0, max=1.0,
                                             help="near-hit similarity threshold")] = 0.8,
    seed: Annotated[int, typer.Option("--seed", help="which records get the canary")] = 0,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="override KEY=VALUE, e.g. privacy.epsilon=2 (repeat; a list entry by "
        "its index: generators.0.top_p=0.9)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print only JSON on stdout")] = False,
) -> None:
    """Plant a canary in N private records, run the method, count exact and near hits."""
    from ..api import run_generation
    from ..eval.audits import DEFAULT_CANARY
    from ..eval.canary import run_canary_audit

    result = run_canary_audit(
        config, output, generate=run_generation, canary=canary_text or DEFAULT_CANARY,
        copies=copies, seed=seed, threshold=threshold, overrides=parse_sets(set_ or []),
        progress=not (quiet or as_json),
    )
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    hits, control = result["synthetic"], result.get("zero_shot") or {}
    from ..statement import format_epsilon

    table = Table(title=f"Canary audit ({result['method']}, epsilon "
                        f"{format_epsilon(result['epsilon'])})",
                  show_header=False)
    table.add_row("copies inserted", str(result["copies"]))
    table.add_row("exact hits in release", f"{hits['exact']} of {hits['outputs']}")
    table.add_row("near hits in release", str(hits["near"]))
    table.add_row("zero-shot control (exact / near)",
                  f"{control.get('exact', '-')} / {control.get('near', '-')}")
    table.add_row("result", str(output / "audit_canary.json"))
    Console().print(table)


@audit_app.command("run")
def audit_run_cmd(
    run_dir: Annotated[Path, typer.Argument(help="run folder")],
    holdout: Annotated[Path | None, typer.Option(
        "--holdout", help="real records the run never saw (default for demo runs: the demo "
        "test split)")] = None,
    text: Annotated[str | None, typer.Option("--text", help="text column of the holdout")] = None,
    pii_column: Annotated[list[str] | None, typer.Option(
        "--pii-column", help="private column holding PII values (repeat)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print only JSON on stdout")] = False,
) -> None:
    """DCR, membership inference and PII leakage of a finished run; writes
    private/eval/audit.json (operator only). Bars count the texts embedded and the audits
    done (none with --json or --quiet)."""
    from ..eval.suite import audit_run

    show = not (quiet or as_json)
    with progress.session(enabled=show):
        result = audit_run(run_dir, holdout, text=text, pii_columns=pii_column or None,
                           progress=show)
    if as_json:
        typer.echo(json.dumps(result, default=str))
        return
    from .evaluate import print_audit

    print_audit(result)
    typer.echo(f"written: {run_dir / 'private' / 'eval' / 'audit.json'}")


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.add_typer(audit_app, name="audit")
