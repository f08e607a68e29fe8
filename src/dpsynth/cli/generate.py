"""CLI command: dpsynth generate CONFIG --output DIR [--resume]."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigError
from ..files import read_jsonl
from ..statement import format_delta, format_epsilon, stop_reason

err_console = Console(stderr=True)


def parse_sets(values: list[str]) -> dict[str, object]:
    """--set KEY=VALUE options -> {dotted key: YAML-parsed value}; a malformed one is a
    ConfigError naming it."""
    out: dict[str, object] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: use KEY=VALUE, e.g. --set privacy.epsilon=2")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(f"--set {key.strip()}: the value is not valid YAML{where} "
                              "(quote a string that holds ':', '#', '[' or '{')") from None
    return out


def generate(
    config: Annotated[Path, typer.Argument(help="run configuration (YAML)")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="run folder")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue a stopped run")] = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="override KEY=VALUE, e.g. privacy.epsilon=2 (repeat; a list entry by "
        "its index: generators.0.top_p=0.9)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bars")] = False,
    no_cap: Annotated[bool, typer.Option(
        "--no-cap", help="run past the default epsilon cap (10) of a data source that has no "
        "cap of its own (privacy.no_cap); a cap set with `budget set` still applies")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Run a PE-family method (aug_pe, wasp, secpe, zero_shot) and write release/."""
    from ..api import run_generation
    from ..run_folder import RunDir

    output = output or Path("runs") / config.stem
    if resume and not set_ and RunDir(output).exists() \
            and RunDir(output).meta().get("status") == "finished":
        err_console.print(f"{output}: this run already finished; nothing to resume "
                          "(release/ is complete)", markup=False, highlight=False)
    try:  # a DpsynthError goes to the root group: one `error:` line, exit 2
        run_dir = run_generation(config, output, resume=resume,
                                 overrides=parse_sets(set_ or []), progress=not quiet,
                                 no_cap=no_cap)
    except KeyboardInterrupt as err:
        err_console.print(f"stopped ({stop_reason(err)}); run.json says so. Continue with: "
                          f"dpsynth generate {config} -o {output} --resume", markup=False,
                          highlight=False)
        raise typer.Exit(130) from None
    summary = json.loads((run_dir / "release" / "summary.json").read_text())
    privacy = json.loads((run_dir / "release" / "privacy.json").read_text())
    if as_json:
        typer.echo(json.dumps({"run_dir": str(run_dir), **summary}))
        return
    print_summary(run_dir, summary, privacy)


def _duplicates(run_dir: Path) -> tuple[int, bool] | None:
    """(rows, dropped) of the run's duplicate rows, from private/diagnostics.jsonl (the
    operator's terminal may show them; no shared file holds them)."""
    from ..diagnostics import read_diagnostics

    found = [d for d in read_diagnostics(run_dir) if d.get("kind") == "duplicates"]
    return (int(found[-1]["rows"]), bool(found[-1]["dropped"])) if found else None


def print_summary(run_dir: Path, summary: dict, privacy: dict) -> None:
    console = Console()
    table = Table(title=f"dpsynth {summary['method']}: done", show_header=False)
    table.add_row("synthetic samples", str(summary["samples"]))
    if privacy.get("epsilon") is None:
        table.add_row("privacy spent", "no record-level (epsilon, delta) guarantee")
    else:
        table.add_row("privacy spent", escape(
            f"({format_epsilon(privacy['epsilon'])}, {format_delta(privacy['delta'])})-DP per "
            f"{privacy['unit']} [{privacy.get('accountant')}, noise {privacy.get('noise')}]"))
    if privacy.get("noise_note"):
        table.add_row("noise", f"[yellow]{escape(privacy['noise_note'])}[/yellow]")
    if "secret_protection" in privacy:
        table.add_row("secret protection", str(privacy["secret_protection"].get("summary", "")))
    calls = str(summary.get("llm_calls", "?"))
    if summary.get("llm_calls_earlier_attempts"):
        calls += f" (+{summary['llm_calls_earlier_attempts']} paid by earlier attempts)"
    table.add_row("LLM calls", calls)
    if summary.get("http_retries"):
        table.add_row("HTTP retries", str(summary["http_retries"]))
    if summary.get("attempts", 1) > 1:
        table.add_row("attempts", str(summary["attempts"]))
    weights = _last_generator_weights(run_dir)
    if weights:
        table.add_row("generator weights", ", ".join(f"{k} {v:.2f}" for k, v in weights.items()))
    dups = _duplicates(run_dir)
    if dups:
        table.add_row("duplicate rows", f"{dups[0]:,} "
                      + ("dropped (data.deduplicate)" if dups[1] else
                         "kept as records (data.deduplicate: true drops them)")
                      + " [dim]- operator only[/dim]")
    table.add_row("release", str(run_dir / "release"))
    table.add_row("synthetic data", str(run_dir / "release" / "synthetic.jsonl"))
    table.add_row("privacy statement", str(run_dir / "release" / "privacy.json"))
    console.print(table)


def _last_generator_weights(run_dir: Path) -> dict[str, float]:
    """WASP: the generator weights of the last round, from stats.jsonl."""
    path = run_dir / "stats.jsonl"
    if not path.is_file():
        return {}
    rows = read_jsonl(path)
    weights = [r["generator_weights"] for r in rows if isinstance(r.get("generator_weights"),
                                                                  dict)]
    return weights[-1] if weights else {}


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.command("generate")(generate)
