"""The private-statistics engine a method is handed: map shard kernels over the shards of the
private records, reduce their partial statistics exactly (docs/methods.md §0).

:class:`PrivateCompute` names no method. Its engines say how a kernel reaches the shards
(:class:`dpsynth.compute.local.LocalCompute`: one shard in this process;
:class:`dpsynth.compute.ray_engine.RayCompute`: one per Ray actor); the statistics any method
may ask for (label counts, kNN and Top-Q vote histograms, label values) are built here from
those maps and the exact sums of :mod:`dpsynth.compute.kernels`. Noise is never added: the
driver's privacy session adds it once, to the summed statistic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import kernels
from .kernels import Partial


class PrivateCompute:
    """Exact private statistics over shards, without noise (the session adds it)."""

    engine = "base"

    def __init__(self, user_level: bool) -> None:
        self.user_level = user_level

    # -- how kernels reach the shards (each engine) ------------------------------------------
    def map(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``kernel(shard, *args, **kwargs)`` on every shard, in shard order: the partial
        statistics, in this process. ``kernel`` must be a :func:`~dpsynth.compute.shard_kernel`
        and return no record."""
        raise NotImplementedError

    def map_keeping(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> tuple[list[Any], list[Any]]:
        """As :meth:`map` for a kernel that returns a pair (shown, kept): the ``shown`` parts
        come to this process; the ``kept`` parts stay off it (Ray: object refs, never
        fetched), for :meth:`off_driver` and later kernels only."""
        raise NotImplementedError

    def off_driver(self, fn: Callable[..., Any], *args: Any, returns: int = 1) -> Any:
        """``fn(*args)`` where the kept parts are (Ray: a task, which resolves the object refs
        among ``args``); its ``returns`` results as handles, read with :meth:`fetch` or passed
        on to kernels."""
        raise NotImplementedError

    def fetch(self, handle: Any) -> Any:
        """The value behind a handle of :meth:`off_driver`."""
        return handle

    def shared(self, array: np.ndarray) -> Any:
        """A handle to a public array that every shard reads (e.g. the candidates)."""
        return array

    def close(self) -> None:
        """Release the engine's workers (a no-op for the local engine)."""

    # -- exact reductions --------------------------------------------------------------------
    def summed(self, kernel: Callable[..., Partial], n: int, scale: np.ndarray | float,
               *args: Any, **kwargs: Any) -> np.ndarray:
        """The exact sum (float64, length ``n``) of a kernel's :class:`Partial` over the
        shards: integers times ``scale``, or whole user buckets in bucket order."""
        return kernels.finish(kernels.sum_partials(self.map(kernel, *args, **kwargs)), n,
                              scale)

    # -- the statistics any method may ask for ----------------------------------------------
    def n_records(self) -> int:
        """How many records the shards hold (private: never log it)."""
        return int(sum(self.map(kernels.shard_size)))

    def label_counts(self, n_labels: int) -> np.ndarray:
        """True label histogram, L2 sensitivity 1 (per record or per user)."""
        return self.summed(kernels.label_count_partial, n_labels, 1.0, n_labels)

    def knn_histogram(self, cand_emb: np.ndarray, cand_labels: np.ndarray, k: int,
                      **vote_options: Any) -> np.ndarray:
        """The true kNN vote histogram over the candidates (docs/methods.md §1)."""
        cand_labels = np.asarray(cand_labels, dtype=np.int64)
        return self.summed(kernels.knn_partial, len(cand_emb),
                           kernels.knn_weights(cand_labels, k), self.shared(cand_emb),
                           cand_labels, k, **vote_options)

    def topq_histograms(self, cand_emb: np.ndarray, cand_labels: np.ndarray, q: int,
                        **vote_options: Any) -> np.ndarray:
        """The true Top-Q concat(H_near, H_far) (docs/methods.md §2)."""
        cand_labels = np.asarray(cand_labels, dtype=np.int64)
        return self.summed(kernels.topq_partial, 2 * len(cand_emb), 2.0 ** -(q - 1),
                           self.shared(cand_emb), cand_labels, q, **vote_options)

    def label_value_counts(self, columns: Sequence[str], max_values_per_user: int = 1
                           ) -> dict[str, tuple[list[str], np.ndarray]]:
        """Exact counts of the values present in each label column (sorted values; float64),
        for label-domain discovery: each record adds 1 to its value; at user level each user
        adds ``1/sqrt(k')`` to at most ``max_values_per_user`` of their values
        (``kernels.user_value_weights``: L2 norm 1, at most 1 to any value)."""
        parts = self.map(kernels.label_value_partial, list(columns), max_values_per_user)
        return kernels.sum_label_value_partials(parts, list(columns))
