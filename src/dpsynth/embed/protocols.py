"""What an embedder may offer, as typed seams (issue 47): every embedder has a ``name``, a
``dim`` and ``embed``; a fast one says which engine ran (``engine_tag``); a cached one has a
``cache_key`` and a path around its cache (``encode_uncached``). Callers branch on these with
``isinstance``, never on ``getattr``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TextEmbedder(Protocol):
    """Unit-norm float32 vectors of texts: ``embed(texts) -> [n, dim]``."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray: ...


@runtime_checkable
class EngineTagged(Protocol):
    """An embedder that says which engine ran (``openvino-bf16``, ``torch``)."""

    engine_tag: str


@runtime_checkable
class CachedEmbedder(Protocol):
    """An embedder with an on-disk cache: its key, and a way around it (private texts are
    never cached)."""

    cache_key: str

    def encode_uncached(self, texts: Sequence[str]) -> np.ndarray: ...
