"""Aug-PE (Xie et al. 2024, "Differentially Private Synthetic Data via Foundation Model APIs 2:
Text"), the baseline of the family. docs/methods.md §1.

1. the noisy (label x length) histogram (Gaussian, sensitivity 1) -> N_y released texts per
   label, V_y samples kept per label each round (the voting population, sized so a
   candidate's expected votes stand above the noise) and the texts' length;
2. RANDOM_API: V_y * L zero-shot generations per label;
3. T times: embed; each private record votes for its k nearest same-label candidates with
   weight 1/sqrt(k) (L2 sensitivity 1); H~ = H + N(0, sigma^2); H~ <- max(H~ - theta, 0);
   keep the top V_y (or sample); VARIATION_API gives each kept sample L - 1 variations;
4. the release: the last vote's winners and their variations, N_y per label.
Privacy: (T + 1) Gaussian mechanisms of one noise multiplier, composed by the accountant (T
when one label class and declared sizes need no histogram).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..context import PrivateView, Releaser, Rngs
from ..evolution.lengths import N_BINS
from ..evolution.operators import Generation
from ..evolution.parts import (
    first_per_label,
    lookahead_embeddings,
    reference_set,
    release_from_winners,
    released_sizes,
    select_and_vary,
)
from ..evolution.pool import Pool
from ..evolution.selection import allocate, select_per_label, split_weights, thresholded
from ..evolution.strategy import Start, StrategyState, VoteResult
from ..planning import VoteShape, voting_population
from ..privacy import ReleasePlan
from ..privacy.lattice import Lattice
from ..voting import vote_index_from
from .base import Job, Outcome, PrivacyPlan
from .pe import PEMethod, vote_release_plan


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


@dataclass
class AugPEState(StrategyState):
    """Aug-PE's state: ``quota`` (released texts per label), ``vote_quota`` (samples kept per
    label each voting round) and ``max_words`` / ``min_words`` (the length band the generators
    write in), all post-processing of the released (label x length) histogram or public
    settings."""

    vote_quota: np.ndarray | None = None
    max_words: int | None = None
    min_words: int | None = None
    #: the released length distribution's bins up to max_words (each zero-shot request's
    #: length is drawn from it); None with a declared synthesis.max_words
    length_mix: list[float] | None = None
    #: the tuned models the generators run (folders under private/preference), if any
    tuned: list[str] | None = None


class AugPEStrategy:
    """Aug-PE's parts for the shared loop. The votes run on a population sized so that a
    candidate's expected votes stand above the noise (:func:`dpsynth.planning.
    voting_population`); the release is drawn from the last vote's winners
    (:func:`release_from_winners`), so its size does not thin the votes."""

    def __init__(self, config: RunConfig, shape: VoteShape, view: PrivateView,
                 releaser: Releaser, gen: Generation, rngs: Rngs) -> None:
        self.config = config
        self.syn = config.synthesis
        self.shape = shape
        self.view = view
        self.releaser = releaser
        self.gen = gen
        self.rngs = rngs
        self.state = AugPEState()

    def _sizes(self) -> tuple[np.ndarray, np.ndarray, int | None, int | None,
                              list[float] | None]:
        """(quota, vote_quota, max_words, min_words, length_mix) from one release of the
        (label x length) histogram when anything needs it (several labels, an automatic
        population or length), else from the public settings. The length mix only with an
        estimated length and ``synthesis.lengths: drawn``."""
        syn, n_labels = self.syn, self.view.n_labels
        if not AugPE.releases_sizes(self.config, n_labels):
            # one label class, a declared length and (with votes) a declared population
            population = voting_population(self.config, self.shape, 0.0, n_labels,
                                           self.releaser.sigma) if syn.iterations else syn.samples
            return np.array([syn.samples]), np.array([population]), syn.max_words, \
                syn.min_words, None
        sizes = released_sizes(self.view, self.releaser)
        # a label's count sums its N_BINS noisy cells: shrunk by that noise (post-processing)
        counts = split_weights(sizes.label_counts, self.releaser.noise_variance(N_BINS),
                               syn.label_split)
        quota = allocate(syn.samples, counts)
        if not syn.iterations:
            vote_quota = quota
        else:
            population = voting_population(self.config, self.shape, sizes.records, n_labels,
                                           self.releaser.sigma)
            vote_quota = allocate(population, counts)
            vote_quota = np.minimum(np.maximum(vote_quota, (quota > 0).astype(np.int64)), quota)
        mix = sizes.length_mix() if syn.max_words is None and syn.lengths == "drawn" else None
        return quota, vote_quota, syn.max_words or sizes.max_words(), \
            syn.min_words or (None if syn.max_words else sizes.min_words()), mix

    def initial(self) -> Start:
        quota, vote_quota, words, least, mix = self._sizes()
        self.state.quota, self.state.vote_quota = quota, vote_quota
        self.state.max_words, self.state.min_words = words, least
        self.state.length_mix = mix
        self.gen.write_up_to(words, least, mix)
        # one zero-shot pass serves both: the voting pool (the first vote_quota x L of each
        # label) and the zero-shot reference of the release's size
        full = self.gen.zero_shot(np.maximum(quota, vote_quota * self.syn.pool_multiplier),
                                  "init")
        pool = first_per_label(full, vote_quota * self.syn.pool_multiplier)
        return Start(pool, reference_set(full, quota, self.rngs))

    def _restore(self) -> None:
        """The generators' length and tuned models from the state (a resumed run)."""
        self.gen.write_up_to(self.state.max_words, self.state.min_words, self.state.length_mix)
        for g, name in enumerate(self.state.tuned or []):
            self.gen.use_tuned(g, self.view.run.private / "preference" / name)

    def vote(self, t: int, pool: Pool, emb: np.ndarray) -> VoteResult:
        syn = self.syn
        self._restore()
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
        assert self.state.quota is not None and self.state.vote_quota is not None
        self._restore()
        if self.syn.preference.enabled:  # trained on the released scores: post-processing
            self.state.tuned = self.gen.learn_from_votes(
                pool, vote.scores, self.view.run.private / "preference", f"iter{t}")
        if not last:
            return select_and_vary(self.gen, self.rngs, self.syn, t, pool, vote.scores,
                                   self.state.vote_quota, last)
        winners = pool.take(select_per_label(vote.scores, pool.labels, self.state.vote_quota,
                                             self.syn.selection, self.rngs(f"select{t}")))
        return release_from_winners(self.gen, winners, self.state.quota, f"release{t}")


class AugPE(PEMethod):
    name = "aug_pe"
    private_passes = ("embed",)
    #: the voting population is sized from the released record count (planning)
    sizes_votes = True
    #: and the texts' length from the same released histogram
    estimates_length = True
    #: its release is the last vote's winners and their variations
    releases_from_winners = True

    @staticmethod
    def releases_sizes(config: RunConfig, n_labels: int) -> bool:
        """Whether the run releases the (label x length) histogram: with several label
        classes (the label counts), or to size the votes or the texts automatically."""
        syn = config.synthesis
        return n_labels > 1 or syn.max_words is None or (
            syn.population is None and syn.iterations > 0)

    def release_plan(self, config: RunConfig, n_labels: int) -> ReleasePlan:
        """The sizes histogram (:meth:`releases_sizes`) and the T votes; k = 1 at record
        level: one record adds 1 to one candidate's count (shift profile (1,))."""
        shifts = (1,) if config.synthesis.k == 1 and config.privacy.unit == "record" else ()
        return vote_release_plan(config, int(self.releases_sizes(config, n_labels)),
                                 config.synthesis.iterations, shifts)

    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, plan: PrivacyPlan) -> AugPEStrategy:
        return AugPEStrategy(config, self.votes(config, view.n_labels), view, releaser, gen,
                             rngs)

    def trains_on_votes(self, config: RunConfig) -> bool:
        """Learning from the votes (``synthesis.preference``), when on."""
        return config.synthesis.preference.enabled

    @classmethod
    def extras(cls, config: RunConfig) -> list[tuple[str, str, str]]:
        """Learning from the votes trains with trl and peft (``[finetune]``)."""
        if not config.synthesis.preference.enabled:
            return []
        return [("trl", "finetune", "synthesis.preference"),
                ("peft", "finetune", "synthesis.preference")]

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        super().validate(config, n_records, n_labels)
        if config.synthesis.preference.enabled and any(
                g.backend != "local" for g in config.generators):
            raise ConfigError("synthesis.preference trains the generator's weights: every "
                              "generator must be local (backend local)")

    def statement_extras(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """Whether the generators learned from the votes, and from what."""
        if not job.config.synthesis.preference.enabled:
            return {}
        return {"preference_training": (
            "after each vote the local generator was tuned (LoRA, DPO) on pairs of synthetic "
            "candidates ranked by the released noisy votes, with public prompts: "
            "post-processing of released values; no private record reached the trainer")}
