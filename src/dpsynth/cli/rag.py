"""CLI commands: rag."""

from __future__ import annotations

import typer


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
