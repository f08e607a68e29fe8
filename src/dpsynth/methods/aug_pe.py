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

import numpy as np

from ..config import RunConfig, SynthesisConfig
from ..context import PrivateView, Releaser, Rngs
from ..evolution.loop import Start, StrategyState, VoteResult
from ..evolution.operators import Generation
from ..evolution.parts import (
    lookahead_embeddings,
    noisy_quota,
    reference_set,
    select_and_vary,
)
from ..evolution.pool import Pool
from ..evolution.selection import thresholded
from ..evolution.voting import vote_index_from
from ..privacy.lattice import Lattice
from .pe import PEMethod


def knn_lattice(cand_labels: np.ndarray, k: int, unit: str) -> Lattice:
    """The public lattice of the vote histogram (docs/methods.md §1): at record level counts
    times 1 / sqrt(kk) per candidate (kk = min(k, candidates of its label), public); k = 1:
    integer counts, one record adds 1 to one cell (shift profile (1,)). At user level each
    user's vote vector is truncated onto the fixed-point grid (voting._bound_users)."""
    from ..compute.kernels import knn_weights

    if unit == "user":
        return Lattice.fixed_point()
    if k == 1:
        return Lattice.counts()
    return Lattice(knn_weights(np.asarray(cand_labels, dtype=np.int64), k), True)


class AugPEStrategy:
    """Aug-PE's parts for the shared loop."""

    def __init__(self, syn: SynthesisConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs) -> None:
        self.syn = syn
        self.view = view
        self.releaser = releaser
        self.gen = gen
        self.rngs = rngs
        self.state = StrategyState()

    def initial(self) -> Start:
        quota = noisy_quota(self.view, self.releaser, self.syn.samples)
        self.state.quota = quota
        pool = self.gen.zero_shot(quota * self.syn.pool_multiplier, "init")
        return Start(pool, reference_set(pool, quota, self.rngs))

    def vote(self, t: int, pool: Pool, emb: np.ndarray) -> VoteResult:
        syn = self.syn
        vote_emb = lookahead_embeddings(self.gen, pool, emb, syn.lookahead, f"look{t}")
        votes = self.view.compute.knn_histogram(vote_emb, pool.labels, syn.k,
                                                index=vote_index_from(syn))
        noisy = self.releaser.gaussian(f"iter{t}/votes", votes, 1.0, name="votes",
                                       lattice=knn_lattice(pool.labels, syn.k,
                                                           self.view.config.privacy.unit))
        scores = thresholded(noisy, syn.threshold * self.releaser.sigma)
        return VoteResult(scores, {"votes": noisy}, {
            "noise_sigma": self.releaser.sigma,
            "vote_mass": float(noisy.sum()),
            "candidates_with_votes": int((scores > 0).sum()),
        })

    def next(self, t: int, pool: Pool, vote: VoteResult, last: bool) -> Pool:
        assert self.state.quota is not None
        return select_and_vary(self.gen, self.rngs, self.syn, t, pool, vote.scores,
                               self.state.quota, last)


class AugPE(PEMethod):
    name = "aug_pe"
    private_passes = ("embed",)

    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs) -> AugPEStrategy:
        return AugPEStrategy(config.synthesis, view, releaser, gen, rngs)

    def vote_shifts(self, config: RunConfig) -> tuple[int, ...]:
        """k = 1 at record level: one record adds 1 to one candidate's count."""
        return (1,) if config.synthesis.k == 1 and config.privacy.unit == "record" else ()
