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
from .kernels import Partial, ShardData, TextShard

if TYPE_CHECKING:
    from ..context import PrivateView

__all__ = ["LocalCompute", "PrivateCompute", "data_compute", "make_compute"]


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

    def public_labels(self, rows: np.ndarray) -> np.ndarray:
        """Joint label codes of ``rows``, in that order. Only for rows a method treats as
        public (SecPE's records without secrets)."""
        raise NotImplementedError

    def masked_label_counts(self, take: np.ndarray, n_labels: int) -> np.ndarray:
        """Exact label histogram (int64) of the rows in ``take`` (a global boolean mask)."""
        parts = self._map("masked_label_count_partial",
                          self._shared(np.asarray(take, dtype=bool)), n_labels)
        return np.sum(parts, axis=0, dtype=np.int64)

    # -- statistics of the texts and labels (no embeddings needed) -----------------------------
    def _map_text(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        """``kernels.<kernel>(text shard, ...)`` on every shard, in shard order."""
        raise NotImplementedError

    def n_records(self) -> int:
        """How many records the shards hold (private: never log it)."""
        return int(sum(self._map_text("shard_size")))

    def label_value_counts(self, columns: Sequence[str]) -> dict[str, tuple[list[str],
                                                                           np.ndarray]]:
        """Exact counts of the values present in each label column (sorted values; float64),
        for label-domain discovery: each record (or user, scaled to L2 norm 1) adds at most 1
        to any value (``label_domain.value_counts``)."""
        parts = self._map_text("label_value_partial", list(columns), self.user_level)
        return kernels.sum_label_value_partials(parts, list(columns))

    def secret_stats(self, specs: Sequence[Any], *, strict: bool = False) -> Any:
        """SecPE's secret scan as a :class:`dpsynth.secrets.SecretIndex` over the global rows:
        which record holds which secret (secret ids, never values) and the definitions'
        messages; what ``SecretPlan`` calibrates from. Random-word definitions take two passes:
        summed document frequencies (by word id), then the scan for the drawn ids."""
        from ..secrets import SecretSpec, choose_random_word_ids, secret_index_from_hits

        parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s)
                  for s in specs]
        chosen: dict[int, list[int]] = {}
        if any(s.kind == "random_words" for s in parsed):
            df = kernels.sum_counts(self._map_text("word_df_partial"))
            chosen = {j: choose_random_word_ids(df, s) for j, s in enumerate(parsed)
                      if s.kind == "random_words"}
        parts = self._map_text("secret_partial", parsed, chosen)
        hits = []
        for j in range(len(parsed)):
            merged: dict[Any, list[np.ndarray]] = {}
            for part in parts:
                for key, rows in part[j].items():
                    merged.setdefault(key, []).append(rows)
            hits.append({key: np.sort(np.concatenate(v)) for key, v in merged.items()})
        return secret_index_from_hits(hits, parsed, self.n_records(), strict=strict)

    def keyword_histogram(self, vocab: Any, k: int, fill: str, *,
                          generator_factory: Any = None, max_new_tokens: int = 64) -> np.ndarray:
        """DP-SynRAG's true keyword histogram h (docs/methods.md §4) over the documents (one
        per user at user level), float64; sensitivity as in methods.synrag.accounting."""
        parts = self._map_text("keyword_partial", vocab, k, fill, self.user_level,
                               generator_factory, max_new_tokens)
        return kernels.finish(kernels.sum_partials(parts), len(vocab))

    def close(self) -> None:
        """Release workers (a no-op for the local engine)."""


class LocalCompute(PrivateCompute):
    """One shard, this process: the private embeddings of ``embeddings()`` (the run's cache)."""

    engine = "local"

    def __init__(self, embeddings: Callable[[], np.ndarray], labels: np.ndarray,
                 users: Sequence[str] | None, dataset: Any = None) -> None:
        super().__init__(user_level=users is not None)
        self._embeddings = embeddings
        self._labels = np.asarray(labels, dtype=np.int64)
        self._users = None if users is None else np.asarray(list(users), dtype=object)
        self._shard: ShardData | None = None
        self._dataset = dataset
        self._text: TextShard | None = None

    @classmethod
    def for_dataset(cls, dataset: Any, user_level: bool) -> LocalCompute:
        """The text and label statistics of a loaded dataset (no embeddings) in this process."""
        def no_embeddings() -> np.ndarray:
            raise RuntimeError("this LocalCompute holds no embeddings (for_dataset)")

        out = cls(no_embeddings, np.zeros(0, dtype=np.int64), None, dataset)
        out.user_level = user_level
        return out

    @property
    def text_shard(self) -> TextShard:
        if self._text is None:
            if self._dataset is None:
                raise RuntimeError("this LocalCompute was built without the dataset")
            users = self._dataset.users if self.user_level else None
            self._text = kernels.text_shard(self._dataset, users)
        return self._text

    def _map_text(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [getattr(kernels, kernel)(self.text_shard, *args, **kwargs)]

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

    def public_labels(self, rows: np.ndarray) -> np.ndarray:
        return self._labels[np.asarray(rows, dtype=np.int64)]


def make_compute(ctx: PrivateView) -> PrivateCompute:
    """The engine ``ctx.config.compute`` names, over the run's private data: with ``ray``
    the shards that loaded a sharded dataset (no per-record field is read here), else this
    process over the loaded dataset."""
    if ctx.config.compute.engine == "ray":
        from .ray_engine import RayCompute

        return RayCompute.for_context(ctx)
    users = ctx.dataset.users if ctx.config.privacy.unit == "user" else None
    return LocalCompute(lambda: ctx.private_embeddings, ctx.label_codes, users, ctx.dataset)


def data_compute(dataset: Any, user_level: bool) -> PrivateCompute:
    """The engine that computes a dataset's text and label statistics: the Ray shards of a
    :class:`dpsynth.compute.sharded.ShardedDataset`, else this process."""
    engine = getattr(dataset, "compute", None)
    if engine is not None:
        return engine
    return LocalCompute.for_dataset(dataset, user_level)
