"""The run's embedder, built on first use and shared by everyone handed it: the generation's
operators and the private-statistics engine (docs/architecture.md, "Seams"). It is a value
handed down: whoever needs vectors calls :meth:`SharedEmbedder.get`, on this floor, and
nothing calls back into the method that made it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import EmbedderConfig
from ..llm.runtime import resolve_device
from ..progress import step
from .embedder import Embedder
from .protocols import EngineTagged


def embedder_device(device: str) -> str:
    """The embedder's torch device for ``embedder.device`` (``auto``: a GPU when torch sees
    one)."""
    return "cpu" if device == "cpu" else resolve_device(device)


def configured_embedder(cfg: EmbedderConfig, cache_dir: Path) -> Embedder:
    """The run's configured embedder (``embedder`` section), its cache in ``cache_dir``."""
    return Embedder(cfg.model, cache_dir=cache_dir, batch_size=cfg.batch_size,
                    engine=cfg.engine, threads=cfg.threads, device=embedder_device(cfg.device))


class SharedEmbedder:
    """The configured embedder (``config``, its vector cache in ``cache_dir``), loaded on the
    first :meth:`get` (a run that votes on nothing loads none), or ``given``: a ready one used
    instead (the tests' fakes, an API caller's). ``log``: the run's log."""

    def __init__(self, config: EmbedderConfig, cache_dir: Path, *, given: Any = None,
                 log: Callable[[str], None] = lambda _: None) -> None:
        self.config = config
        self.cache_dir = cache_dir
        self.log = log
        self._embedder = given

    def get(self) -> Any:
        """The embedder, loaded now if it is not yet."""
        if self._embedder is None:
            cfg = self.config
            self.log(f"loading embedder {cfg.model} (engine {cfg.engine})")
            with step(f"loading embedder {cfg.model}"):
                embedder = configured_embedder(cfg, self.cache_dir)
            tag = embedder.engine_tag if isinstance(embedder, EngineTagged) else \
                type(embedder).__name__
            self.log(f"embedder engine: {tag}")
            self._embedder = embedder
        return self._embedder
