"""CLI commands: dpsynth rag build | ask | serve (DP-SynRAG, docs/methods.md §4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError
from ..statement import format_delta, format_epsilon, stop_reason
from .generate import parse_sets

group = typer.Typer(help="DP-SynRAG: a DP synthetic knowledge base, and RAG over it.",
                    no_args_is_help=True)


@group.command("build")
def build(
    config: Annotated[Path, typer.Argument(help="run configuration (YAML) with a synrag section")],
    output: Annotated[Path, typer.Option("--output", "-o", help="run folder")],
    resume: Annotated[bool, typer.Option("--resume", help="continue a stopped build")] = False,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="override KEY=VALUE, e.g. privacy.epsilon=2 (repeat; a list entry by "
        "its index: generators.0.top_p=0.9)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
    require_passages: Annotated[bool, typer.Option(
        "--require-passages", help="exit 3 when the knowledge base comes out empty")] = False,
) -> None:
    """Build a DP synthetic knowledge base: release/kb.jsonl, kb.faiss, privacy.json. An empty
    knowledge base is a warning (exit 0) unless --require-passages."""
    from .. import progress
    from ..api import build_kb
    from ..preflight import check_output_writable

    try:  # a DpsynthError goes to the root group: one `error:` line, exit 2
        check_output_writable(output)
        with progress.session(enabled=not as_json):
            run_dir = build_kb(config, output, resume=resume,
                               overrides=parse_sets(set_ or []),
                               echo=None if as_json else progress.private_note,
                               progress=not as_json)
    except KeyboardInterrupt as err:
        typer.echo(f"stopped ({stop_reason(err)}); run.json says so. Continue with: "
                   f"dpsynth rag build {config} -o {output} --resume", err=True)
        raise typer.Exit(130) from None
    summary = json.loads((run_dir / "release" / "summary.json").read_text())
    empty = not summary.get("kb_passages")
    if as_json:
        typer.echo(json.dumps({"run_dir": str(run_dir), **summary}))
    else:
        typer.echo(f"knowledge base: {run_dir / 'release' / 'kb.jsonl'} "
                   f"({summary['kb_passages']} passages from {summary['clusters']} clusters)")
        typer.echo(f"privacy: ({format_epsilon(summary['epsilon'])}, "
                   f"{format_delta(summary['delta'])})-DP, "
                   f"statement in {run_dir / 'release' / 'privacy.json'}")
        if empty:
            typer.echo("warning: the knowledge base is empty (see the warnings in "
                       f"{run_dir / 'release' / 'summary.json'})", err=True)
    if empty and require_passages:
        typer.echo("error: the knowledge base is empty and --require-passages was given",
                   err=True)
        raise typer.Exit(3)


@group.command("ask")
def ask(
    question: Annotated[str, typer.Argument(help="the question")],
    kb: Annotated[Path, typer.Option("--kb", help="run folder of a built KB")],
    k: Annotated[int | None, typer.Option(
        "-k", help="passages to retrieve (default: the build's synrag.retrieve)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON only")] = False,
) -> None:
    """Answer a question from the synthetic KB (no privacy cost: post-processing)."""
    from .. import progress
    from ..rag.answer import open_answerer

    if not question.strip():
        raise ConfigError("the question is blank (empty or whitespace only)")
    with progress.session(enabled=not as_json):  # spinners while the models load and answer
        answerer = open_answerer(kb)
        with progress.step("retrieving and answering"):
            result = answerer.ask(question, k)
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    typer.echo(result["answer"])
    if result["unsupported"]:
        typer.echo("warning: the answer names " + ", ".join(result["unsupported"])
                   + ", which none of its sources contains", err=True)
    typer.echo("sources:")
    for p in result["passages"]:
        typer.echo(f"  passage {p['id']} (similarity {p['score']:.3f}): {p['text'][:200]}")


@group.command("serve")
def serve(
    kb: Annotated[Path, typer.Option("--kb", help="run folder of a built KB")],
    host: Annotated[str, typer.Option("--host", help="bind address (loopback default)")] =
    "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    max_pending: Annotated[int, typer.Option(
        "--max-pending", min=1, help="questions admitted at once; more get 503 + Retry-After")]
    = 8,
    queue_timeout: Annotated[float, typer.Option(
        "--queue-timeout", min=0.1, help="seconds a question may wait for the model")] = 30.0,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", help="every request must send 'Authorization: Bearer KEY'; required "
        "off loopback; default $DPSYNTH_API_KEY")] = None,
) -> None:
    """Serve the KB as a JSON API: GET /health, POST /ask {"question": ..., "k": 3}. Prints
    its URL once it listens."""
    from .. import progress
    from ..api_key import server_api_key
    from ..rag.service import kb_app, require_serving
    from ..rag.service import serve as run_server

    require_serving()  # before any model loads
    key = server_api_key(host, api_key)  # refused off loopback without a key
    with progress.session():  # spinners while the models load; then "ready at URL"
        app = kb_app(kb, max_pending=max_pending, queue_timeout=queue_timeout, api_key=key)
    run_server(kb, host, port, app=app, api_key=key)


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.add_typer(group, name="rag")
