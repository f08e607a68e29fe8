"""`dpsynth rag build CONFIG --output DIR`: DP-SynRAG (docs/methods.md §4) through the one
runner. The method itself is :mod:`dpsynth.methods.synrag`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..hooks import RunHooks
from ..methods.synrag.method import SynRAG

__all__ = ["build_kb"]


def build_kb(
    config: RunConfig | str | Path,
    output_dir: str | Path,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    generator: Any = None,
    embedder: Any = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    hooks: RunHooks | None = None,
) -> Path:
    """Build (or resume) a DP synthetic knowledge base; returns the run folder.

    ``generator`` / ``embedder``: ready objects instead of the configured models (the
    generator must expose next-token logits); ``echo`` receives operator messages;
    ``hooks``: what the caller plugs into the run (:class:`dpsynth.hooks.RunHooks`: the tests
    stop a build after a cluster's checkpoint, as a kill would)."""
    from ..runner import RunOptions, run_method

    return run_method(config, output_dir, resume=resume, overrides=overrides,
                      method=SynRAG(config, output_dir), options=RunOptions(
                          progress=progress, echo=echo,
                          generators=None if generator is None else [generator],
                          embedder=embedder, hooks=hooks or RunHooks()))
