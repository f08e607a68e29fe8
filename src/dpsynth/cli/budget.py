"""CLI commands: ``dpsynth budget show | set | rekey`` (the cross-run ledger of data sources).

The ledger and its semantics are described in docs/methods.md §0 and
:mod:`dpsynth.privacy.ledger`. Every error (a ledger path that is a directory, an unreadable or
corrupt file, a missing key, bad arguments) is a DpsynthError: one clear line on stderr and exit
code 2 (from the root command group), never a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ConfigError, InputError

budget_app = typer.Typer(
    name="budget",
    help="The privacy budget of each data source across runs (the ledger).",
    no_args_is_help=True,
)

LedgerOption = Annotated[
    Path | None,
    typer.Option(
        "--ledger", help="Ledger file (default $DPSYNTH_LEDGER or ~/.dpsynth/ledger.json)."
    ),
]


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _label(src: dict[str, Any]) -> str:
    return src["names"][0] if src["names"] else f"(unnamed {src['source']})"


@budget_app.command("show")
def show(
    ledger: LedgerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """List each data source: its names, versions, spent budget, cap and runs."""
    from rich.console import Console
    from rich.table import Table

    from dpsynth.privacy import BudgetLedger
    from dpsynth.privacy.ledger import DEFAULT_TOTAL_EPSILON, counted

    book = BudgetLedger(ledger)
    sources = book.sources()
    if as_json:
        typer.echo(json.dumps({"ledger": str(book.path), "sources": sources}))
        return
    console = Console(soft_wrap=False)
    if not sources:
        console.print(f"No data source recorded in {book.path}")
        return
    for src in sources:
        cap = f" of {_num(src['total_epsilon'], 'g')}" if src["total_epsilon"] is not None \
            else f" (no cap of its own: {DEFAULT_TOTAL_EPSILON:g} by default, --no-cap past it)"
        capd = f" of {_num(src['total_delta'], 'g')}" if src["total_delta"] is not None else ""
        table = Table(title=f"{_label(src)}  [dim]{src['source']}[/dim]", title_justify="left")
        for col in ("run", "status", "guarantee", "unit", "epsilon", "delta", "updated"):
            table.add_column(col, overflow="fold")  # wrap a long name or path, never cut it
        for e in src["runs"]:
            eps, dl = counted(e)
            table.add_row(str(e["run_id"]), str(e.get("status", "")),
                          str(e.get("guarantee", "dp")), str(e.get("unit", "")),
                          _num(eps, ".4g"), _num(dl, ".3g"), str(e.get("updated", "")))
        nodp = src["runs_without_dp_guarantee"]
        table.add_row("[b]total[/b]", "", f"{nodp} without DP" if nodp else "", "",
                      f"[b]{src['epsilon']:.4g}{cap}[/b]", f"[b]{src['delta']:.3g}{capd}[/b]",
                      "", end_section=True)
        console.print(table)
        also = src["names"][1:]
        if also:
            console.print(f"  also known as: {', '.join(also)}")
        console.print(f"  versions: {len(src['versions'])}"
                      + "".join(f"\n    {v['content'] or '(from ledger v2)'}  first seen "
                                f"{v['added'] or '-'}" for v in src["versions"]))
        console.print()


@budget_app.command("set")
def set_budget(
    total_epsilon: Annotated[
        float | None, typer.Option("--total-epsilon", help="The source's total epsilon.")
    ] = None,
    total_delta: Annotated[
        float | None, typer.Option("--total-delta", help="The source's total delta.")
    ] = None,
    source: Annotated[
        str | None,
        typer.Option("--source", help="A source's id or name (as `budget show` lists it)."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", help="The private data file: sets the budget of the source(s) "
                                    "it belongs to (a new source when none)."),
    ] = None,
    text: Annotated[str, typer.Option("--text", help="Text column of --data.")] = "text",
    name: Annotated[
        str | None, typer.Option("--name", help="The source name of --data (as data.source in "
                                                "the run's config; default: its resolved path).")
    ] = None,
    ledger: LedgerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON only.")] = False,
) -> None:
    """Set a data source's total budget; it applies to every later run charged to it."""
    from dpsynth.privacy import BudgetLedger

    if (source is None) == (data is None):
        raise ConfigError("give exactly one of --source NAME_OR_ID or --data FILE")
    if total_epsilon is None and total_delta is None:
        raise ConfigError("give --total-epsilon, --total-delta, or both")
    if total_epsilon is not None and not (math.isfinite(total_epsilon) and total_epsilon >= 0):
        raise ConfigError(f"--total-epsilon must be a finite number >= 0, got {total_epsilon}")
    if total_delta is not None and not (0 <= total_delta < 1):
        raise ConfigError(f"--total-delta must be in [0, 1), got {total_delta}")
    book = BudgetLedger(ledger)
    target: Any = source
    if data is not None:
        target = _file_identity(book, data, text, name)
    sources = book.set_budget(target, total_epsilon, total_delta)
    for src in sources:  # the cap cannot bound what an unbounded run already released
        if src["runs_without_dp_guarantee"]:
            typer.echo(f"warning: {_label(src)} already has {src['runs_without_dp_guarantee']} "
                       "run(s) without an (epsilon, delta) guarantee (epsilon = inf or SecPE); "
                       "what they released is not bounded by this cap, and later such runs on "
                       "it are refused", err=True)
    if as_json:
        typer.echo(json.dumps({"ledger": str(book.path), "sources": sources}))
        return
    for src in sources:
        new = "" if src["runs"] else " (no run recorded on it yet)"
        typer.echo(
            f"{_label(src)} [{src['source']}]: total epsilon {_num(src['total_epsilon'], 'g')}, "
            f"total delta {_num(src['total_delta'], 'g')} (spent so far: epsilon "
            f"{src['epsilon']:.4g}, delta {src['delta']:.3g}){new}")


def _file_identity(book: Any, path: Path, text: str, name: str | None) -> Any:
    """The identity of a private file as a run reads it (its text column for the sketch)."""
    from dpsynth.data import DataError, load_dataset
    from dpsynth.identity import DataIdentity

    try:
        ds = load_dataset(path, text, [], None, on_duplicate="ignore", max_chars=None)
    except DataError as err:
        raise InputError(f"--data {path}: {err}") from None
    except OSError as err:
        raise InputError(f"--data {path}: cannot read ({err.strerror or err})") from None
    key = book.sketch_key()
    return DataIdentity(name=name or str(path.resolve()), content=ds.content_digest(),
                        records=ds.fingerprint(), sketch=ds.text_sketch(key),
                        normalised=ds.text_sketch(key, normalised=True))


@budget_app.command("rekey")
def rekey(
    ledger: LedgerOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: the old key is lost for good.")
                   ] = False,
) -> None:
    """Give a ledger whose key is lost a new key, keeping every source's spending by name.

    Content versions, sketches and seed tags were keyed with the lost key and are dropped: a
    copy of a source's file at another path is recognised again only after a run (or `budget
    set --data`) at the source's own path records its version anew."""
    from dpsynth.privacy import BudgetLedger

    if not yes:
        raise ConfigError("budget rekey forgets every content version the ledger knew; restore "
                          "the key from a backup if you can, else confirm with --yes")
    out = BudgetLedger(ledger).rekey()
    typer.echo(f"new key written; {out['sources']} sources kept with their spending, "
               f"{out['versions_dropped']} content versions dropped")


def register(root: typer.Typer) -> None:
    """Add the ``budget`` command group to the root app."""
    root.add_typer(budget_app, name="budget")
