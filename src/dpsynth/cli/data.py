"""CLI commands: ``dpsynth data check`` and ``dpsynth data demo``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

MAX_CLASSES_SHOWN = 40

data_app = typer.Typer(
    name="data",
    help="Check private data files and write the built-in demo corpus.",
    no_args_is_help=True,
)


@data_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="Data file: .csv, .jsonl/.json or .parquet.")],
    text: Annotated[str, typer.Option("--text", help="Text column.")],
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Label column (repeat for several).")
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", help="User id column (unit of privacy).")
    ] = None,
    max_chars: Annotated[
        int, typer.Option("--max-chars", help="Longest text allowed (0: no limit).", min=0)
    ] = 20000,
    values: Annotated[
        list[str] | None,
        typer.Option(
            "--values",
            help="COL=FILE: the declared values of label column COL (one per line, as in "
            "data.label_values); other values are errors. Repeat for several columns.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
) -> None:
    """Validate FILE and print a summary and every problem; exit 1 when there is an error."""
    from dpsynth.data import check_dataset

    domain = _declared_values(values or [], label or [])
    report = check_dataset(file, text, label or [], user, max_chars=max_chars or None,
                           label_values=domain)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        _print_report(report.summary, report.problems, report.warnings)
    raise typer.Exit(0 if report.ok else 1)


def _declared_values(specs: list[str], labels: list[str]) -> dict[str, list[str]] | None:
    """``COL=FILE`` options as a label domain (None when there are none)."""
    from dpsynth.config import ConfigError, read_label_values_file

    if not specs:
        return None
    out: dict[str, list[str]] = {}
    for spec in specs:
        col, sep, path = spec.partition("=")
        if not sep or not col or not path:
            raise typer.BadParameter(f"{spec!r}: expected COL=FILE", param_hint="--values")
        if col not in labels:
            raise typer.BadParameter(f"{col!r} is not a --label column", param_hint="--values")
        try:
            out[col] = read_label_values_file(Path(path), col)
        except ConfigError as err:
            raise typer.BadParameter(str(err), param_hint="--values") from None
    return out


def _print_report(summary: dict[str, Any], problems: list[Any], warnings: list[Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    overview = Table(title=f"{summary['file']}", show_header=False)
    overview.add_column("what")
    overview.add_column("value", justify="right")
    overview.add_row("rows", f"{summary['rows']:,}")
    if summary.get("users") is not None:
        overview.add_row("users", f"{summary['users']:,}")
    if "duplicates" in summary:
        overview.add_row("duplicates", f"{summary['duplicates']:,}")
    for key, unit in (("text_chars", "characters"), ("text_words", "words")):
        stats = summary.get(key)
        if stats:
            overview.add_row(
                f"text {unit}",
                f"min {stats['min']} / median {stats['median']:g} / "
                f"mean {stats['mean']:g} / max {stats['max']}",
            )
    overview.add_row("errors", str(len(problems)))
    overview.add_row("warnings", str(len(warnings)))
    console.print(overview)
    for column, counts in summary.get("labels", {}).items():
        table = Table(title=f"label {column!r}: {len(counts)} classes")
        table.add_column("class")
        table.add_column("count", justify="right")
        table.add_column("share", justify="right")
        total = max(sum(counts.values()), 1)
        for i, (cls, n) in enumerate(counts.items()):
            if i == MAX_CLASSES_SHOWN:
                table.add_row(f"... {len(counts) - i} more", "", "")
                break
            table.add_row(escape(cls) if cls else "(empty)", f"{n:,}", f"{100 * n / total:.1f}%")
        console.print(table)
    for p in problems:
        console.print(f"[bold red]error[/]   {escape(str(p))}", soft_wrap=True, highlight=False)
    for p in warnings:
        console.print(f"[yellow]warning[/] {escape(str(p))}", soft_wrap=True, highlight=False)
    if problems:
        console.print(f"[bold red]{len(problems)} error(s)[/]: fix them before using this file.")
    else:
        console.print(f"[green]OK[/]: {summary['rows']:,} rows, {len(warnings)} warning(s).")


@data_app.command("demo")
def demo(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the corpus into.")],
    n: Annotated[int, typer.Option("--n", help="Rows in private.csv.", min=1)] = 600,
    seed: Annotated[int, typer.Option("--seed", help="Seed (the corpus is a function of it).")] = 0,
    test_n: Annotated[int, typer.Option("--test-n", help="Rows in test.csv.", min=1)] = 300,
    as_json: Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")] = False,
) -> None:
    """Write the fictional clinic-message demo corpus (private.csv, test.csv, knowledge.json)."""
    from dpsynth.demo_corpus import write_demo_corpus

    paths = write_demo_corpus(out, n=n, seed=seed, test_n=test_n)
    if as_json:
        typer.echo(json.dumps({k: str(v) for k, v in paths.items()}))
        return
    for key, path in paths.items():
        typer.echo(f"{key:>9}: {path}")
    typer.echo(
        f"Try: dpsynth data check {paths['private']} --text text "
        "--label department --label urgency --user patient_id"
    )


def register(root: typer.Typer) -> None:
    """Add the ``data`` command group to the root app."""
    root.add_typer(data_app, name="data")
