"""The Python API behind `dpsynth generate`: one function runs (or resumes) a run of a
text-releasing method (docs/architecture.md).

    from dpsynth.api import run_generation
    run_dir = run_generation("examples/demo.yaml", "runs/demo")

The run's life (open or resume, data, privacy plan, ledger, session, work, statement, summary,
status) is :func:`dpsynth.runner.run_method`'s; this module only picks the method.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .config import RunConfig
from .runner import open_run, run_method

__all__ = ["open_run", "run_generation"]


def run_generation(config: RunConfig | str | Path, output_dir: str | Path, *,
                   resume: bool = False, overrides: dict[str, Any] | None = None,
                   progress: bool = True, generators: Sequence[Any] | None = None,
                   embedder: Any | None = None) -> Path:
    """Run a text-releasing method end to end, or resume it; returns the run folder.

    ``generators`` / ``embedder`` replace the configured models with ready objects (one
    generator per configured entry), e.g. the deterministic fakes of the fast tests.

    A refusal before any work (bad data, a config the method cannot run, a ledger refusal)
    removes the new run folder again; a stop after work began keeps it for ``--resume``, with a
    true status in run.json (failed with the error's class, or interrupted by SIGINT / SIGTERM).
    """
    return run_method(config, output_dir, resume=resume, overrides=overrides,
                      progress=progress, generators=generators, embedder=embedder,
                      releases="text")
