"""The `dpsynth` command line: a thin layer over the Python API.

Each area of the toolkit owns one module here that defines ``register(root)``, which adds
its commands or command group to the root app. Heavy imports (torch, transformers) belong
inside the command functions so that ``dpsynth --help`` stays instant.
"""

from __future__ import annotations

import os

import typer

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

app = typer.Typer(
    name="dpsynth",
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
