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

    def centre_sums(self, centres: dict[int, np.ndarray], coins: np.ndarray, clip_R: float,
                    n_records: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """SecPE: per label, exact per-centre sums (float64) and counts of the sampled rows
        clipped to R. ``coins``: one uniform per record in global row order, drawn by the
        driver's session and shipped as one shared object; each shard samples row i iff
        coins[i] < its rate (kept by the shard: :meth:`plan_secret_rates`)."""
        kernels.fixed_point_limit(clip_R, n_records)
        parts = self._map("centre_partial", self._shared(np.asarray(coins, dtype=np.float64)),
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

    def label_value_counts(self, columns: Sequence[str], max_values_per_user: int = 1
                           ) -> dict[str, tuple[list[str], np.ndarray]]:
        """Exact counts of the values present in each label column (sorted values; float64),
        for label-domain discovery: each record adds 1 to its value; at user level each user
        adds ``1/sqrt(k')`` to at most ``max_values_per_user`` of their values
        (``kernels.user_value_weights``: L2 norm 1, at most 1 to any value)."""
        parts = self._map_text("label_value_partial", list(columns), self.user_level,
                               max_values_per_user)
        return kernels.sum_label_value_partials(parts, list(columns))

    def _secret_specs(self, specs: Sequence[Any]) -> tuple[list[Any], dict[int, list[int]]]:
        """Parsed definitions and, for random-word ones, the word ids drawn from the summed
        document frequencies (by word id: the words stay on the shards)."""
        from ..secrets import SecretSpec, choose_random_word_ids

        parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s)
                  for s in specs]
        chosen: dict[int, list[int]] = {}
        if any(s.kind == "random_words" for s in parsed):
            df = kernels.sum_counts(self._map_text("word_df_partial"))
            chosen = {j: choose_random_word_ids(df, s) for j, s in enumerate(parsed)
                      if s.kind == "random_words"}
        return parsed, chosen

    # -- SecPE: the secret split, the SecretNoise plan, the rates on the shards -----------
    def secret_split(self, specs: Sequence[Any], *, strict: bool = False) -> Any:
        """SecPE's secret scan (docs/methods.md §3): each shard finds its records' secrets (by
        secret id) and keeps that membership; this process gets a
        :class:`dpsynth.secrets.SecretSplit`: the public rows and exact counts, summed. Its
        ``parts`` are the engine's handles to the shards' membership, for
        :meth:`plan_secret_rates` only."""
        from ..secrets import split_from_facts

        parsed, chosen = self._secret_specs(specs)
        facts, parts = self._secret_scan(parsed, chosen)
        split = split_from_facts(facts, parsed, self.n_records(), strict=strict)
        split.parts, split.specs = parts, parsed
        return split

    def plan_secret_rates(self, split: Any, p: float, r: float, T: int, digest: str,
                          folder: Any = None, discretization: float | None = None
                          ) -> dict[str, Any]:
        """SecretNoise over the shards' membership (``secpe_theory.plan_from_hits``); the
        rates go to the shards, which keep (and save, under ``digest``) their rows' rates;
        returns the plan's summary (``sigma_star``, ``max_rate``, secrets per type).
        ``folder``: the run's private folder, where the local engine saves its rates;
        ``discretization``: the accountant's grid (``secpe.discretization``)."""
        from ..methods.secpe_theory import DEFAULT_DISCRETIZATION

        disc = DEFAULT_DISCRETIZATION if discretization is None else float(discretization)
        rates, summary = self._secret_plan(split.parts, split.specs, split.n_records, p, r,
                                           T, disc)
        self.keep_secret_rates(rates, digest, folder)
        split.parts = []  # planned: the handles (Ray: object refs) are let go
        return summary

    def _secret_scan(self, parsed: list[Any], chosen: dict[int, list[int]]
                     ) -> tuple[list[dict[str, Any]], list[Any]]:
        """(every shard's ``secrets.hit_facts``, handles to their hits)."""
        got = self._map_text("secret_scan_partial", parsed, chosen)
        return [f for f, _ in got], [h for _, h in got]

    def _secret_plan(self, parts: list[Any], parsed: list[Any], n: int, p: float, r: float,
                     T: int, discretization: float) -> tuple[Any, dict[str, Any]]:
        from ..methods.secpe_theory import plan_from_hits

        return plan_from_hits(parts, parsed, n, p, r, T, discretization=discretization)

    def keep_secret_rates(self, rates: Any, digest: str, folder: Any = None) -> None:
        """Give the shards SecPE's rates ((private rows, rates), or the engine's handle)."""
        raise NotImplementedError

    def load_secret_rates(self, digest: str, folder: Any = None) -> bool:
        """Whether the shards hold (or reload from their saved plan) the rates of ``digest``."""
        raise NotImplementedError

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
        self._secret_rates: tuple[np.ndarray, np.ndarray] | None = None
        self._rates_digest: str | None = None

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
            self._attach_rates()
        return self._shard

    def _attach_rates(self) -> None:
        if self._shard is not None and self._secret_rates is not None:
            self._shard.rates = kernels.rates_for_rows(self._secret_rates, self._shard.rows)

    def keep_secret_rates(self, rates: Any, digest: str, folder: Any = None) -> None:
        """Keeps (private rows, rates) here and, given ``folder``, saves them there."""
        if folder is not None:
            kernels.save_rates(kernels.rates_file(folder), digest, *rates)
        self._secret_rates, self._rates_digest = rates, digest
        self._attach_rates()

    def load_secret_rates(self, digest: str, folder: Any = None) -> bool:
        if self._rates_digest != digest:
            saved = (None if folder is None
                     else kernels.load_rates(kernels.rates_file(folder), digest))
            if saved is None:
                return False
            self._secret_rates, self._rates_digest = saved, digest
            self._attach_rates()
        return True

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
