"""CLI commands: ``dpsynth budget show`` (the cross-run privacy budget ledger)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

budget_app = typer.Typer(
    name="budget",
    help="Privacy budget spent per dataset across runs (the ledger).",
    no_args_is_help=True,
)


@budget_app.command("show")
def show(
    ledger: Annotated[
        Path | None,
        typer.Option(
            "--ledger", help="Ledger file (default $DPSYNTH_LEDGER or ~/.dpsynth/ledger.json)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """List spending per dataset and run."""
    from dpsynth.privacy import BudgetLedger, PrivacyConfigError

    book = BudgetLedger(ledger)
    try:
        entries = book.entries()
        datasets = sorted({e["dataset"] for e in entries})
        totals = {d: book.spent(d) for d in datasets}
    except PrivacyConfigError as err:
        typer.echo(f"Error: {err}", err=True)
        raise typer.Exit(code=2) from None
    if as_json:
        out = {
            "ledger": str(book.path),
            "datasets": [
                {
                    "dataset": d,
                    "epsilon": totals[d][0],
                    "delta": totals[d][1],
                    "runs": [e for e in entries if e["dataset"] == d],
                }
                for d in datasets
            ],
        }
        typer.echo(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not entries:
        console.print(f"No runs recorded in {book.path}")
        return
    table = Table(title=f"Privacy budget ledger ({book.path})")
    for col in ("dataset", "run", "status", "epsilon", "delta", "updated"):
        table.add_column(col)
    for d in datasets:
        for e in (e for e in entries if e["dataset"] == d):
            settled = e.get("status") == "settled"
            eps = e["epsilon"] if settled else e["reserved_epsilon"]
            dl = e["delta"] if settled else e["reserved_delta"]
            status = "settled" if settled else "reserved"
            table.add_row(
                d[:12], e["run_id"], status, f"{eps:.4g}", f"{dl:.3g}", e.get("updated", "")
            )
        table.add_row(
            d[:12],
            "[b]total[/b]",
            "",
            f"[b]{totals[d][0]:.4g}[/b]",
            f"[b]{totals[d][1]:.3g}[/b]",
            "",
            end_section=True,
        )
    console.print(table)


def register(root: typer.Typer) -> None:
    """Add the ``budget`` command group to the root app."""
    root.add_typer(budget_app, name="budget")
