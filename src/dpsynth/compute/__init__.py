"""The one seam through which the methods touch private records: :class:`PrivateCompute`.

``compute.engine: local`` (the default) computes every statistic in this process over the whole
private set; ``compute.engine: ray`` (:mod:`dpsynth.compute.ray_engine`) keeps the private rows
sharded by user on Ray actors and brings back only per-shard partial statistics. Both engines
call the same kernels (:mod:`dpsynth.compute.kernels`) and the same exact sums, so for the same
inputs and noise the release is byte-identical. Noise is added once, by the driver's privacy
session, to the summed statistic (docs/methods.md §0). DP-SynRAG's per-cluster private
prediction on Ray lives in :mod:`dpsynth.compute.rag`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import kernels
from .kernels import Partial, ShardData

if TYPE_CHECKING:
    from ..context import RunContext

__all__ = ["LocalCompute", "PrivateCompute", "make_compute"]


class PrivateCompute:
    """Private statistics without noise (the session adds it): the methods' only access to
    private embeddings. Subclasses say how a kernel runs over the shards (``_map``)."""

    engine = "base"

    def __init__(self, user_level: bool) -> None:
        self.user_level = user_level

    def _map(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``kernels.<kernel>(shard, *args, **kwargs)`` on every shard, in shard order."""
        raise NotImplementedError

    def _shared(self, array: np.ndarray) -> Any:
        """A handle to a public array that every shard reads (the candidates)."""
        return array

    def _summed(self, kernel: str, n: int, scale: np.ndarray | float, *args: Any,
                **kwargs: Any) -> np.ndarray:
        parts: list[Partial] = self._map(kernel, *args, user_level=self.user_level, **kwargs)
        return kernels.finish(kernels.sum_partials(parts), n, scale)

    # -- the statistics ------------------------------------------------------------------------
    def label_counts(self, n_labels: int) -> np.ndarray:
        """True label histogram, L2 sensitivity 1 (per record or per user)."""
        return self._summed("label_count_partial", n_labels, 1.0, n_labels)

    def knn_histogram(self, cand_emb: np.ndarray, cand_labels: np.ndarray, k: int,
                      **vote_options: Any) -> np.ndarray:
        """Aug-PE's true vote histogram over the candidates (docs/methods.md §1)."""
        cand_labels = np.asarray(cand_labels, dtype=np.int64)
        return self._summed("knn_partial", len(cand_emb), kernels.knn_weights(cand_labels, k),
                            self._shared(cand_emb), cand_labels, k, **vote_options)

    def topq_histograms(self, cand_emb: np.ndarray, cand_labels: np.ndarray, q: int,
                        **vote_options: Any) -> np.ndarray:
        """WASP's true concat(H_near, H_far) (docs/methods.md §2)."""
        cand_labels = np.asarray(cand_labels, dtype=np.int64)
        return self._summed("topq_partial", 2 * len(cand_emb), 2.0 ** -(q - 1),
                            self._shared(cand_emb), cand_labels, q, **vote_options)

    def centre_sums(self, centres: dict[int, np.ndarray], take: np.ndarray, clip_R: float,
                    n_records: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """SecPE: per label, exact per-centre sums (float64) and counts of the sampled rows
        (``take``: global boolean mask, drawn by the driver's session) clipped to R."""
        kernels.fixed_point_limit(clip_R, n_records)
        parts = self._map("centre_partial", self._shared(np.asarray(take, dtype=bool)),
                          centres, clip_R)
        return kernels.sum_centre_partials(parts)

    def public_embeddings(self, rows: np.ndarray) -> np.ndarray:
        """Embeddings of ``rows``, in that order. Only for rows a method treats as public
        (SecPE's records without secrets)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release workers (a no-op for the local engine)."""


class LocalCompute(PrivateCompute):
    """One shard, this process: the private embeddings of ``embeddings()`` (the run's cache)."""

    engine = "local"

    def __init__(self, embeddings: Callable[[], np.ndarray], labels: np.ndarray,
                 users: Sequence[str] | None) -> None:
        super().__init__(user_level=users is not None)
        self._embeddings = embeddings
        self._labels = np.asarray(labels, dtype=np.int64)
        self._users = None if users is None else np.asarray(list(users), dtype=object)
        self._shard: ShardData | None = None

    @property
    def shard(self) -> ShardData:
        if self._shard is None:
            n = len(self._labels)
            # buckets order the user-level sums; record-level sums are exact integers
            buckets = (kernels.buckets_of(list(self._users)) if self._users is not None
                       else np.zeros(n, dtype=np.int64))
            self._shard = ShardData(emb=self._embeddings(), labels=self._labels,
                                    rows=np.arange(n, dtype=np.int64), buckets=buckets,
                                    users=self._users)
        return self._shard

    def _map(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(kernels, kernel)(self.shard, *args, **kwargs)]

    def public_embeddings(self, rows: np.ndarray) -> np.ndarray:
        return self._embeddings()[np.asarray(rows, dtype=np.int64)]


def make_compute(ctx: RunContext) -> PrivateCompute:
    """The engine ``ctx.config.compute`` names, over the run's private data."""
    users = ctx.dataset.users if ctx.config.privacy.unit == "user" else None
    if ctx.config.compute.engine == "ray":
        from .ray_engine import RayCompute

        return RayCompute.for_context(ctx)
    return LocalCompute(lambda: ctx.private_embeddings, ctx.label_codes, users)
