"""The `dpsynth` command line: a thin layer over the Python API.

Each area of the toolkit owns one module here that defines ``register(root)``, which adds
its commands or command group to the root app. Heavy imports (torch, transformers) belong
inside the command functions so that ``dpsynth --help`` stays instant.

Errors: a command raises a :class:`dpsynth.errors.DpsynthError` (or lets one through); the root
group catches that class in one place, prints ``error: <message>`` on stderr and exits 2. Any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
from typing import Any

import click
import typer
from typer.core import TyperGroup

from ..errors import DpsynthError

#: Exit status of every deliberate error (the same as a click usage error).
ERROR_EXIT = 2

# Nothing may download from a model hub at run time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from . import (  # noqa: E402
    audit,
    bench,
    budget,
    data,
    evaluate,
    generate,
    llm,
    privacy,
    rag,
)


class DpsynthGroup(TyperGroup):
    """The root command group: turns any DpsynthError raised below it into one line + exit 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DpsynthError as err:
            click.echo(f"error: {err}", err=True)
            if err.hint:
                click.echo(f"  {err.hint}", err=True)
            ctx.exit(ERROR_EXIT)


app = typer.Typer(
    name="dpsynth",
    cls=DpsynthGroup,
    help="Differentially private synthetic text (Aug-PE, WASP, SecPE, DP-SynRAG).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold private text
)

for _module in (generate, data, privacy, budget, llm, rag, evaluate, audit, bench):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
