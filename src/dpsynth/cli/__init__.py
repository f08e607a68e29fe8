"""The `dpsynth` command line: a thin layer over the Python API.

Each area of the toolkit owns one module here that defines ``register(root)``, which adds
its commands or command group to the root app. Heavy imports (torch, transformers) belong
inside the command functions so that ``dpsynth --help`` stays instant.

Errors: a command raises a :class:`dpsynth.errors.DpsynthError` (or lets one through); the root
group catches that class in one place, prints ``error: <message>`` on stderr and exits 2. Any
other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
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
# Third-party tqdm bars (read when tqdm is first imported) would interleave with the run's one
# progress display (dpsynth.progress), with \r debris in a log.
os.environ.setdefault("TQDM_DISABLE", "1")

from . import (  # noqa: E402
    audit,
    bench,
    budget,
    data,
    evaluate,
    generate,
    llm,
    plan,
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
        except OSError as err:
            if err.errno not in ENVIRONMENT_ERRNOS:
                raise
            click.echo(f"error: {environment_message(err)}", err=True)
            ctx.exit(ERROR_EXIT)


#: OS errors that come from where a command runs (permissions, a read-only or full disk), not
#: from a bug: one ``error:`` line like a DpsynthError.
ENVIRONMENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                                errno.EDQUOT})


def environment_message(err: OSError) -> str:
    """``PATH: permission denied (Permission denied)``-style line for an environment error."""
    where = f"{err.filename}: " if err.filename else ""
    what = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
            errno.EROFS: "the file system is read-only"}.get(err.errno or 0,
                                                          "permission denied")
    return f"{where}{what} ({err.strerror or type(err).__name__})"


app = typer.Typer(
    name="dpsynth",
    cls=DpsynthGroup,
    help="Differentially private synthetic text (Aug-PE, WASP, SecPE, DP-SynRAG).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold private text
)

for _module in (generate, plan, data, privacy, budget, llm, rag, evaluate, audit, bench):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
