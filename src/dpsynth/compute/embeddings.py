"""The embeddings of a run's private texts, as the local engine and the private view read
them: computed on first use by the run's shared embedder (:class:`dpsynth.embed.shared.
SharedEmbedder`, a value handed down), streamed in chunks into a memory-mapped .npy in the
private area (mode 0600) and resumed where a stopped run left it
(:func:`dpsynth.embed.embed_to_file`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.shared import SharedEmbedder
from ..embed.streamed import embed_to_file


class PrivateEmbeddings:
    """``dataset``'s text embeddings, by ``embedder``, into ``path`` on the first call; the
    same array after it. ``log``: the run's log."""

    def __init__(self, embedder: SharedEmbedder, dataset: Any, path: Path,
                 log: Callable[[str], None] | None = None) -> None:
        self.embedder = embedder
        self.dataset = dataset
        self.path = path
        self.log = log
        self._array: np.ndarray | None = None

    def __call__(self) -> np.ndarray:
        if self._array is None:
            self._array = embed_to_file(self.embedder.get(), self.dataset.texts,
                                        len(self.dataset), self.path, log=self.log)
        return self._array
