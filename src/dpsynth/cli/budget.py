"""CLI commands: ``dpsynth budget show`` and ``dpsynth budget set`` (the cross-run ledger).

The ledger and its semantics are described in docs/methods.md §0. Every error (a ledger path that
is a directory, an unreadable or corrupt file, bad arguments) is a DpsynthError: one clear line on
stderr and exit code 2 (from the root command group), never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, DpsynthError, InputError, PrivacyError

budget_app = typer.Typer(
    name="budget",
    help="Privacy budget spent per dataset across runs (the ledger).",
    no_args_is_help=True,
)

LedgerOption = Annotated[
    Path | None,
    typer.Option(
        "--ledger", help="Ledger file (default $DPSYNTH_LEDGER or ~/.dpsynth/ledger.json)."
    ),
]


def _counted(entry: dict[str, Any]) -> tuple[float | None, float | None]:
    if entry.get("guarantee", "dp") != "dp":
        return None, None
    if entry.get("status") == "settled":
        return entry["epsilon"], entry["delta"]
    return entry["reserved_epsilon"], entry["reserved_delta"]


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _collect(ledger: Path | None) -> tuple[Any, list[dict], list[dict[str, Any]]]:
    """(ledger, entries, one summary dict per dataset); a PrivacyError if it cannot be read."""
    from dpsynth.privacy import BudgetLedger

    book = BudgetLedger(ledger)
    try:
        entries = book.entries()
        budgets = book.budgets()
        datasets = sorted({e["dataset"] for e in entries} | set(budgets))
        out = []
        for d in datasets:
            eps, delta = book.spent(d)
            runs = [e for e in entries if e["dataset"] == d]
            b = budgets.get(d) or {}
            out.append(
                {
                    "dataset": d,
                    "epsilon": eps,
                    "delta": delta,
                    "total_epsilon": b.get("total_epsilon"),
                    "total_delta": b.get("total_delta"),
                    "runs_without_dp_guarantee": sum(
                        1 for e in runs if e.get("guarantee", "dp") != "dp"
                    ),
                    "runs": runs,
                }
            )
    except DpsynthError:
        raise
    except (OSError, KeyError, TypeError, ValueError) as err:
        raise PrivacyError(f"{book.path}: cannot read the budget ledger "
                           f"({type(err).__name__})") from None
    return book, entries, out


@budget_app.command("show")
def show(
    ledger: LedgerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """List spending per dataset and run, with each dataset's stored total budget."""
    book, entries, datasets = _collect(ledger)
    if as_json:
        typer.echo(json.dumps({"ledger": str(book.path), "datasets": datasets}))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not datasets:
        console.print(f"No runs recorded in {book.path}")
        return
    table = Table(title=f"Privacy budget ledger ({book.path})")
    for col in ("dataset", "run", "status", "guarantee", "epsilon", "delta", "updated"):
        table.add_column(col)
    for ds in datasets:
        d = ds["dataset"]
        for e in ds["runs"]:
            eps, dl = _counted(e)
            table.add_row(
                d[:12],
                str(e["run_id"]),
                str(e.get("status", "")),
                str(e.get("guarantee", "dp")),
                _num(eps, ".4g"),
                _num(dl, ".3g"),
                str(e.get("updated", "")),
            )
        cap = f" of {_num(ds['total_epsilon'], 'g')}" if ds["total_epsilon"] is not None else ""
        capd = f" of {_num(ds['total_delta'], 'g')}" if ds["total_delta"] is not None else ""
        nodp = ds["runs_without_dp_guarantee"]
        table.add_row(
            d[:12],
            "[b]total[/b]",
            "",
            f"{nodp} without DP" if nodp else "",
            f"[b]{ds['epsilon']:.4g}{cap}[/b]",
            f"[b]{ds['delta']:.3g}{capd}[/b]",
            "",
            end_section=True,
        )
    console.print(table)


@budget_app.command("set")
def set_budget(
    total_epsilon: Annotated[
        float | None, typer.Option("--total-epsilon", help="The dataset's total epsilon.")
    ] = None,
    total_delta: Annotated[
        float | None, typer.Option("--total-delta", help="The dataset's total delta.")
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="Dataset fingerprint (as in run.json / budget show)."),
    ] = None,
    data: Annotated[
        Path | None, typer.Option("--data", help="The private data file (fingerprinted here).")
    ] = None,
    text: Annotated[str, typer.Option("--text", help="Text column of --data.")] = "text",
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Label column(s) of --data, as in the run.")
    ] = None,
    user: Annotated[str | None, typer.Option("--user", help="User column of --data.")] = None,
    ledger: LedgerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Set a dataset's total budget; it applies to every later run on the dataset."""
    from dpsynth.privacy import BudgetLedger

    if (dataset is None) == (data is None):
        raise ConfigError("give exactly one of --dataset FINGERPRINT or --data FILE")
    if total_epsilon is None and total_delta is None:
        raise ConfigError("give --total-epsilon, --total-delta, or both")
    if total_epsilon is not None and not (math.isfinite(total_epsilon) and total_epsilon >= 0):
        raise ConfigError(f"--total-epsilon must be a finite number >= 0, got {total_epsilon}")
    if total_delta is not None and not (0 <= total_delta < 1):
        raise ConfigError(f"--total-delta must be in [0, 1), got {total_delta}")
    book = BudgetLedger(ledger)
    if data is not None:
        from dpsynth.data import load_dataset

        try:
            ds = load_dataset(data, text, label or [], user, on_duplicate="ignore")
        except (ValueError, OSError) as err:  # the loader's DataError is a ValueError
            raise InputError(f"--data {data}: {err}") from None
        dataset = book.dataset_id(ds.fingerprint())
    assert dataset is not None
    known = {e["dataset"] for e in book.entries()} | set(book.budgets())
    stored = book.set_budget(dataset, total_epsilon, total_delta)
    spent = book.spent(dataset)
    out = {
        "ledger": str(book.path),
        "dataset": dataset,
        "total_epsilon": stored.get("total_epsilon"),
        "total_delta": stored.get("total_delta"),
        "epsilon": spent[0],
        "delta": spent[1],
        "known_dataset": dataset in known,
    }
    if as_json:
        typer.echo(json.dumps(out))
        return
    typer.echo(
        f"dataset {dataset[:12]}: total epsilon {_num(out['total_epsilon'], 'g')}, total delta "
        f"{_num(out['total_delta'], 'g')} (spent so far: epsilon {spent[0]:.4g}, delta "
        f"{spent[1]:.3g})"
    )
    if not out["known_dataset"]:
        typer.echo("note: no run on this dataset is recorded in this ledger yet", err=True)


def register(root: typer.Typer) -> None:
    """Add the ``budget`` command group to the root app."""
    root.add_typer(budget_app, name="budget")
