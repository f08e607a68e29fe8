"""A pool of synthetic candidates: texts, joint label codes and the generator of each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Pool:
    """Synthetic candidates: texts, joint label codes, and the index of the generator of each."""

    texts: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sources: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, idx: np.ndarray) -> Pool:
        idx = np.asarray(idx, dtype=np.int64)
        return Pool([self.texts[i] for i in idx], self.labels[idx], self.sources[idx])

    def extend(self, other: Pool) -> Pool:
        return Pool(self.texts + other.texts, np.concatenate([self.labels, other.labels]),
                    np.concatenate([self.sources, other.sources]))

    def to_state(self) -> dict[str, Any]:
        return {"texts": self.texts, "labels": self.labels.tolist(),
                "sources": self.sources.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Pool:
        return cls(list(state["texts"]), np.asarray(state["labels"], dtype=np.int64),
                   np.asarray(state["sources"], dtype=np.int64))

    @classmethod
    def build(cls, texts: list[str | None], labels: list[int], sources: list[int]) -> Pool:
        """A pool from generation results, dropping the failed (None) ones."""
        keep = [i for i, t in enumerate(texts) if t is not None]
        return cls([texts[i] for i in keep], np.asarray(labels, dtype=np.int64)[keep],
                   np.asarray(sources, dtype=np.int64)[keep])
