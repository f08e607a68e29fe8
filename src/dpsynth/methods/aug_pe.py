"""Aug-PE (Xie et al. 2024, "Differentially Private Synthetic Data via Foundation Model APIs 2:
Text"), the baseline of the family. docs/methods.md §1.

1. noisy label counts -> N_y samples per label (Gaussian, sensitivity 1);
2. RANDOM_API: N_y * L zero-shot generations per label;
3. T times: embed; each private record votes for its k nearest same-label candidates with
   weight 1/sqrt(k) (L2 sensitivity 1); H~ = H + N(0, sigma^2); H~ <- max(H~ - theta, 0);
   keep the top N_y (or sample); VARIATION_API gives each kept sample L - 1 variations.
Privacy: (T + 1) Gaussian mechanisms of one noise multiplier, composed by the accountant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..evolution import operators as ops
from ..evolution.loop import Pool
from ..evolution.selection import allocate, select_per_label, thresholded
from ..evolution.voting import vote_index_from
from ..runs import write_jsonl
from .base import Method

if TYPE_CHECKING:
    from ..context import RunContext


def noisy_quota(ctx: RunContext, total: int) -> np.ndarray:
    """Samples per label from DP label counts (never raw frequencies; docs/methods.md §0)."""
    if ctx.n_labels == 1:
        return np.array([total])
    counts = ctx.compute.label_counts(ctx.n_labels)
    noisy = ctx.release_gaussian("label_counts", counts, 1.0, name="label_counts")
    return allocate(total, noisy)


def write_reference(ctx: RunContext, pool: Pool, quota: np.ndarray) -> None:
    """release/zero_shot.jsonl: quota[y] zero-shot samples per label, the epsilon-0 reference
    of the evaluation (only the label split came from DP counts)."""
    rng = ctx.rng_for("zero_shot_reference")
    keep = []
    for y, n_y in enumerate(quota):
        idx = np.flatnonzero(pool.labels == y)
        keep.extend(rng.permutation(idx)[:n_y].tolist())
    write_jsonl(ctx.run.release / "zero_shot.jsonl",
                ctx.rows(pool.take(np.array(sorted(keep), dtype=np.int64))))


class AugPEStrategy:
    """Parts of Aug-PE for the shared loop."""

    def __init__(self) -> None:
        self.quota: np.ndarray | None = None

    def initial(self, ctx: RunContext) -> Pool:
        syn = ctx.config.synthesis
        self.quota = noisy_quota(ctx, syn.samples)
        pool = ops.zero_shot(ctx, self.quota * syn.pool_multiplier, "init")
        write_reference(ctx, pool, self.quota)
        return pool

    def candidate_embeddings(self, ctx: RunContext, t: int, pool: Pool,
                             emb: np.ndarray) -> np.ndarray:
        """Optional lookahead: a candidate is represented by the mean embedding of a few of its
        variations (Aug-PE section 3.2)."""
        n_look = ctx.config.synthesis.lookahead
        if n_look == 0:
            return emb
        look, parents = ops.variations(ctx, pool, n_look, f"look{t}")
        look_emb = ctx.embed_synthetic(look.texts)
        sums = np.zeros(emb.shape, dtype=np.float64)
        np.add.at(sums, parents, look_emb)
        counts = np.bincount(parents, minlength=len(pool))[:, None]
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), emb)
        return (mean / np.linalg.norm(mean, axis=1, keepdims=True)).astype(np.float32)

    def score(self, ctx: RunContext, t: int, pool: Pool,
              emb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        syn = ctx.config.synthesis
        vote_emb = self.candidate_embeddings(ctx, t, pool, emb)
        votes = ctx.compute.knn_histogram(vote_emb, pool.labels, syn.k,
                                          index=vote_index_from(syn))
        noisy = ctx.release_gaussian(f"iter{t}/votes", votes, 1.0, name="votes")
        scores = thresholded(noisy, syn.threshold * ctx.sigma)
        return scores, {
            "noise_sigma": ctx.sigma,
            "vote_mass": float(noisy.sum()),
            "candidates_with_votes": int((scores > 0).sum()),
        }

    def advance(self, ctx: RunContext, t: int, pool: Pool, emb: np.ndarray, scores: np.ndarray,
                last: bool) -> Pool:
        syn = ctx.config.synthesis
        kept = pool.take(select_per_label(scores, pool.labels, self.quota, syn.selection,
                                          ctx.rng_for(f"select{t}")))
        if last or syn.pool_multiplier == 1:
            return kept
        return kept.extend(ops.variations(ctx, kept, syn.pool_multiplier - 1, f"var{t}")[0])

    def finalize(self, ctx: RunContext, pool: Pool) -> Pool:
        """With T = 0 the pool is the initial one: keep quota[y] per label at random."""
        rng = ctx.rng_for("finalize")
        keep = []
        for y, n_y in enumerate(self.quota):
            idx = np.flatnonzero(pool.labels == y)
            keep.extend(idx if len(idx) <= n_y else rng.permutation(idx)[:n_y])
        return pool.take(np.array(sorted(keep), dtype=np.int64))

    def state(self) -> dict[str, Any]:
        return {"quota": None if self.quota is None else self.quota.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.quota = None if state["quota"] is None else np.asarray(state["quota"])


class AugPE(Method):
    name = "aug_pe"

    def strategy(self, ctx: RunContext) -> AugPEStrategy:
        return AugPEStrategy()
