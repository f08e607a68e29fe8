"""Exact k-nearest-neighbour search over a faiss flat index (inner product or L2): the one
place dpsynth builds a flat index (votes, SecPE's centres, the RAG index, audits)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

__all__ = ["Metric", "flat_index", "nearest"]

Metric = Literal["ip", "l2"]


def _f32(x: Any) -> np.ndarray:
    return np.ascontiguousarray(np.atleast_2d(np.asarray(x, dtype=np.float32)))


def flat_index(base: np.ndarray, metric: Metric = "ip") -> Any:
    """An exact faiss flat index (``IndexFlatIP`` or ``IndexFlatL2``) holding ``base`` [n, d]."""
    import faiss

    b = _f32(base)
    if metric == "ip":
        index = faiss.IndexFlatIP(b.shape[1])
    elif metric == "l2":
        index = faiss.IndexFlatL2(b.shape[1])
    else:
        raise ValueError(f"metric must be 'ip' or 'l2', got {metric!r}")
    if len(b):
        index.add(b)
    return index


@contextlib.contextmanager
def _omp_threads(threads: int | None) -> Iterator[None]:
    """faiss's OpenMP threads set to ``threads`` inside the block (None: unchanged)."""
    if threads is None:
        yield
        return
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, int(threads)))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def nearest(queries: np.ndarray, base: np.ndarray, k: int = 1, metric: Metric = "ip",
            threads: int | None = None, batch: int = 16384) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest rows of ``base`` [n, d] for each row of ``queries`` [m, d].

    Returns ``(scores, ids)``, both [m, k]: inner products (largest first) for ``metric="ip"``,
    squared L2 distances (smallest first) for ``"l2"``. ``k`` is capped at n; queries are
    searched ``batch`` rows at a time (bounded memory); ``threads`` sets faiss's OpenMP threads
    for the call."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    b = _f32(base)
    q = _f32(queries) if len(queries) else np.zeros((0, b.shape[1]), dtype=np.float32)
    if q.shape[1] != b.shape[1]:
        raise ValueError(f"queries have dimension {q.shape[1]}, base has {b.shape[1]}")
    kk = min(k, len(b))
    scores = np.empty((len(q), kk), dtype=np.float32)
    ids = np.empty((len(q), kk), dtype=np.int64)
    if kk == 0 or len(q) == 0:
        return scores, ids
    index = flat_index(b, metric)
    with _omp_threads(threads):
        for s in range(0, len(q), batch):
            scores[s:s + batch], ids[s:s + batch] = index.search(q[s:s + batch], kk)
    return scores, ids
