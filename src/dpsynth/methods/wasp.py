"""WASP (Zou et al. 2025): few private samples, several generators, Top-Q weighted voting and
contrastive prompts. docs/methods.md §2.

Rounds 0..T (T = synthesis.iterations): round 0 is zero-shot; after private vote t (t < T) the
generators write round t + 1 from contrastive prompts, so the last round T is written after the
last vote and the synthetic set, accumulated over all T + 1 rounds, has synthesis.samples rows.
Every generator k writes its share w_k of a round's samples per label; each private record gives
2^-q to its q-th nearest (H_near) and q-th furthest (H_far) candidate of its label, q < Q; both
histograms get Gaussian noise, with joint L2 sensitivity sqrt(8/3 (1 - 4^-Q)); the top of
H~_near is the good set, the top of H~_far the bad set; generator weights follow the noisy
nearest votes only (step 4). Federated mode: parties' histograms meet only through Flower's
SecAgg+ (dpsynth.federated); each round is charged at its worst-case noise (only min_parties
noise shares arrive) before it runs (dpsynth.federated.rounds); each party clips its votes to
the public wasp.federated.max_records_per_party, which (not any party's size) sets the SecAgg+
clipping range and grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from ..config import ConfigError, RunConfig, Section, ray_address_form
from ..context import PrivateView, Releaser, Rngs
from ..evolution.operators import Generation
from ..evolution.parts import noisy_label_counts, quota_of, reference_set
from ..evolution.pool import Pool
from ..evolution.selection import allocate, top_indices
from ..evolution.strategy import Start, StrategyState, VoteResult
from ..planning import VoteShape, voting_population
from ..privacy import ReleasePlan, SecAggRounds
from ..privacy.distributed import plan_quantisation
from ..privacy.lattice import Lattice
from ..privacy.planned import secagg_rounds_event
from ..voting import topq_sensitivity, topq_vote, vote_index_from
from ..work import Stage, Work, wasp_stages, wasp_voted, wasp_work
from .base import Job, Outcome, PrivacyPlan
from .pe import PEMethod, vote_release_plan


class FederatedConfig(Section):
    """Federated WASP (docs/methods.md §2): votes summed by Flower SecAgg+ across parties."""

    parties: int = Field(0, ge=0, description="0 = not federated")
    dirichlet_alpha: float = Field(1.0, gt=0)
    max_records_per_party: int = Field(
        10_000, ge=1,
        description="public bound B on the records of one party: each party clips every "
                    "coordinate of its Top-Q votes to [0, B], and B with sigma and P sets the "
                    "SecAgg+ clipping range and grid (never the parties' real sizes). A party "
                    "with more records loses votes (utility), never privacy",
    )
    min_parties: int | None = Field(
        None, ge=2,
        description="fewest parties whose sum may be released (default: all); also the SecAgg+ "
                    "reconstruction threshold, and each round is charged at the noise of this "
                    "many parties",
    )
    ray_address: str = Field(
        "local", description="where Flower's simulation engine runs the parties: 'local' "
                             "(start a one-machine Ray for each round and stop it after), or "
                             "the address of a running Ray cluster ('auto', HOST:PORT, "
                             "'ray://HOST:PORT') that every round joins, with one CPU per party "
                             "actor; the simulated parties' records travel to that cluster's "
                             "nodes, as shards do with compute.engine: ray",
    )

    @field_validator("ray_address")
    @classmethod
    def _ray_address_form(cls, value: str) -> str:
        return ray_address_form(value, "wasp.federated.ray_address")


class WaspConfig(Section):
    """WASP (docs/methods.md §2)."""

    top_q: int = Field(8, ge=1)
    demonstrations: int = Field(8, ge=2)
    contrastive: bool = True
    weighting: bool = True
    weight_temperature: float = Field(1.0, gt=0)
    federated: FederatedConfig = Field(default_factory=FederatedConfig)


def topq_lattice(q: int, unit: str) -> Lattice:
    """The public lattice of (H_near, H_far) (docs/methods.md §2): record-level votes are
    integer multiples of 2^-(Q-1); at user level each user's vector is truncated onto the
    fixed-point grid. Accounted by the zCDP bound (the exact 2Q-shift PLD costs seconds per
    evaluation, too slow for calibration)."""
    return Lattice.fixed_point() if unit == "user" else Lattice(2.0 ** -(q - 1), True)


def generator_weights(near: np.ndarray, sources: np.ndarray, n_generators: int,
                      temperature: float) -> np.ndarray:
    """WASP step 4: s_i = max(H~_near[i], 0) / sum; score_k = (sum_{i in D_k} s_i) |D| / |D_k|;
    w = softmax(score / temperature) (the authors' code uses this softmax)."""
    s = np.maximum(near, 0.0)
    s = s / s.sum() if s.sum() > 0 else np.full(len(s), 1.0 / max(len(s), 1))
    sizes = np.bincount(sources, minlength=n_generators).astype(np.float64)
    mass = np.bincount(sources, weights=s, minlength=n_generators)
    score = np.where(sizes > 0, mass * len(s) / np.maximum(sizes, 1), 0.0)
    z = np.exp((score - score.max()) / temperature)
    z = np.where(sizes > 0, z, 0.0)
    return z / z.sum()


def federated_event(config: RunConfig, sigma: float, sens: float, dimension: int,
                    count: int = 1) -> Any:
    """The charge of federated voting rounds of noise std ``sigma`` (docs/methods.md §2):
    :func:`dpsynth.privacy.planned.secagg_rounds_event` on the config's parties, vote bound
    and Top-Q grid, charged at the fewest shares that can be in the sum, ``min_parties``."""
    wasp = Wasp.settings(config)
    fed = wasp.federated
    return secagg_rounds_event(sigma, sens, fed.parties, fed.min_parties or fed.parties,
                               dimension, count, float(fed.max_records_per_party),
                               topq_grid(wasp.top_q))


def federated_plan(config: RunConfig, sigma: float) -> Any:
    """SecAgg+'s public plan for a round of noise std ``sigma`` (C, the grid, the modulus):
    from the config's vote bound, sigma and P only."""
    wasp = Wasp.settings(config)
    fed = wasp.federated
    return plan_quantisation(vote_bound=float(fed.max_records_per_party), sigma=sigma,
                             num_parties=fed.parties, vote_grid=topq_grid(wasp.top_q))


def topq_grid(q: int) -> float:
    """The lattice of record-level Top-Q votes: 2^-(Q-1)."""
    return 2.0 ** -(q - 1)


def worst_case_sigma(sigma: float, min_parties: int, parties: int) -> float:
    """Std of a federated round's noise when only min_parties of the P noise shares arrive:
    sigma * sqrt(min_parties / P) (SecAgg+ cannot unmask a sum of fewer)."""
    return sigma * math.sqrt(min_parties / parties)


def round_sizes(quota: np.ndarray, rounds: int) -> np.ndarray:
    """[rounds, labels]: each label's total split as evenly as possible over the rounds."""
    return np.stack([allocate(int(q), np.ones(rounds)) for q in quota], axis=1)


def party_split(texts: Sequence[str], label_codes: np.ndarray, fed: FederatedConfig,
                rngs: Rngs) -> list[np.ndarray]:
    """The simulated parties' record indices (dpsynth.federated.split): data-free Dirichlet
    shares and a record-local keyed hash, both from the run's post-processing randomness, so
    one record more or less changes only the party it joins (parties may be empty)."""
    from ..federated.split import dirichlet_shares, record_owners, split_records

    shares = dirichlet_shares(fed.parties, fed.dirichlet_alpha, rngs("parties"))
    key = rngs("party-assignment").bytes(32)
    return split_records(record_owners(texts, label_codes, shares, key), fed.parties)


@dataclass
class WaspState(StrategyState):
    """WASP's state between rounds: the quota, the per-round sizes [rounds, labels], the
    current generator weights and their history, and the candidates each vote is on per
    label (``vote_quota``; None: every candidate of the pool)."""

    sizes: np.ndarray | None = None
    weights: np.ndarray | None = None
    history: list[list[float]] = field(default_factory=list)
    vote_quota: np.ndarray | None = None


class WaspStrategy:
    """WASP's parts for the shared loop: Top-Q votes (near and far), generator weights and
    contrastive rounds."""

    def __init__(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, shape: VoteShape | None = None) -> None:
        self.config = config
        self.shape = shape
        self.syn = config.synthesis
        self.wasp: WaspConfig = Wasp.settings(config)
        self.noise_mode = config.privacy.noise
        self.view = view
        self.releaser = releaser
        self.gen = gen
        self.rngs = rngs
        n = len(config.generators)
        self.state = WaspState(weights=np.full(n, 1.0 / n))

    def initial(self) -> Start:
        counts = noisy_label_counts(self.view, self.releaser)
        quota = quota_of(counts, self.syn.samples, self.releaser.noise_variance(),
                         self.syn.label_split)
        sizes = round_sizes(quota, self.syn.iterations + 1)
        self.state.quota, self.state.sizes = quota, sizes
        records = 0.0 if counts is None else float(max(np.sum(counts), 0.0))
        shape = self.shape or Wasp().votes(self.config, self.view.n_labels)
        population = voting_population(self.config, shape, records, self.view.n_labels,
                                       self.releaser.sigma)
        if population < self.syn.samples:  # sized from the released counts (planning)
            vote_quota = allocate(population, quota)  # at least one a label with samples
            self.state.vote_quota = np.minimum(np.maximum(vote_quota, (quota > 0)), quota)
        pool = self.gen.zero_shot(sizes[0], "round0", self.state.weights)
        return Start(pool, reference_set(pool, sizes[0], self.rngs))

    def _histograms(self, t: int, pool: Pool, emb: np.ndarray) -> np.ndarray:
        sens = topq_sensitivity(self.wasp.top_q)
        key = f"iter{t}/topq"
        if self.wasp.federated.parties == 0:
            hist = self.view.compute.topq_histograms(emb, pool.labels, self.wasp.top_q,
                                                     index=vote_index_from(self.syn))
            return self.releaser.gaussian(key, hist, sens, name="topq_votes",
                                          lattice=topq_lattice(self.wasp.top_q,
                                                               self.view.config.privacy.unit))
        return self.federated(key, pool, emb, sens)

    def federated(self, key: str, pool: Pool, emb: np.ndarray, sens: float) -> np.ndarray:
        """Parties add a discrete Gaussian share of std sigma / sqrt(P) each, on SecAgg+'s grid;
        only the SecAgg+ sum reaches this process.

        The round is charged at its worst case (only min_parties noise shares arrive, and
        SecAgg+ cannot unmask with fewer) and that charge is committed before any party is
        contacted (federated.rounds.accounted_round)."""
        from ..diagnostics import append_diagnostic
        from ..federated import PartyData, federated_noisy_histogram
        from ..federated.core import grid_top_q

        fed = self.wasp.federated
        min_parties = fed.min_parties or fed.parties
        sigma = self.releaser.sigma * sens
        event = federated_event(self.config, sigma, sens, dimension=2 * len(pool))
        # the Top-Q depth whose weights lie on the round's grid (all Q unless the noise is so
        # large that the modulus forces a coarser grid; the sensitivity of Q still bounds it)
        depth = grid_top_q(self.wasp.top_q, federated_plan(self.config, sigma).step)
        view = self.view

        def run_round() -> np.ndarray:
            split = party_split(view.texts, view.label_codes, fed, self.rngs)
            parties = [PartyData(view.private_embeddings[idx], view.label_codes[idx])
                       for idx in split]
            sizes = [len(idx) for idx in split]  # exact: private/diagnostics.jsonl only
            append_diagnostic(view.run, {
                "federated_round": key, "party_sizes": sizes,
                "parties_over_max_records": sum(m > fed.max_records_per_party for m in sizes)})
            result = federated_noisy_histogram(
                parties, emb, pool.labels, partial(topq_vote, q=depth), sigma,
                vote_bound=float(fed.max_records_per_party),  # public: Top-Q weights <= 1
                vote_grid=topq_grid(self.wasp.top_q),
                seed=None if self.noise_mode == "secure"
                else self.rngs.seed_for("federated", key),  # the run's private seed
                noise_mode=self.noise_mode, min_parties=min_parties,
                ray_address=fed.ray_address,
            )
            view.log(f"federated round {key}: {result.parties_present} of {fed.parties} "
                     "parties")
            return result.histogram

        return self.releaser.external_round(key, event, run_round,
                                            view.run.private / "federated")

    def voters(self, t: int, pool: Pool) -> np.ndarray:
        """The candidates vote t is on: with a sized population (``vote_quota``), that many
        of each label's candidates, drawn uniformly from the pool's rounds so far with the
        run's post-processing randomness (a label with fewer has all of them voted on); else
        every candidate. Public inputs only: which candidates are voted on depends on no
        record, so the vote's sensitivity is Top-Q's as over the whole pool."""
        quota = self.state.vote_quota
        if quota is None:
            return np.arange(len(pool))
        rng = self.rngs(f"voters{t}")
        keep = []
        for y, want in enumerate(np.asarray(quota, dtype=np.int64)):
            idx = np.flatnonzero(pool.labels == y)
            keep.append(idx if len(idx) <= want else rng.choice(idx, int(want), replace=False))
        return np.sort(np.concatenate(keep)) if keep else np.zeros(0, np.int64)

    def vote(self, t: int, pool: Pool, emb: np.ndarray) -> VoteResult:
        voted = self.voters(t, pool)
        if len(voted) < len(pool):
            pool, emb = pool.take(voted), emb[voted]
        noisy = self._histograms(t, pool, emb)
        n = len(pool)
        near, far = noisy[:n], noisy[n:]
        names = self.gen.names
        pos = np.maximum(near, 0)
        share = np.bincount(pool.sources, weights=pos, minlength=len(names))
        share = share / share.sum() if share.sum() > 0 else share
        weights = np.asarray(self.state.weights)
        return VoteResult(near, {"near": near, "far": far, "voted": voted}, {
            "voted": int(n),
            "noise_sigma": self.releaser.sigma * topq_sensitivity(self.wasp.top_q),
            "vote_mass": float(near.sum()),
            "generator_weights": dict(zip(names, weights.round(4).tolist(), strict=True)),
            "generator_vote_share": dict(zip(names, share.round(4).tolist(), strict=True)),
        })

    def next(self, t: int, pool: Pool, vote: VoteResult, last: bool) -> Pool:
        wasp, state = self.wasp, self.state
        assert state.sizes is not None and state.weights is not None
        on = vote.histograms.get("voted")  # the candidates the vote was on (None: all)
        voted = pool if on is None or len(on) == len(pool) else pool.take(on)
        if wasp.weighting:
            state.weights = generator_weights(vote.histograms["near"], voted.sources,
                                              len(state.weights), wasp.weight_temperature)
        state.history.append(np.asarray(state.weights).tolist())
        # After the last vote too: round t + 1 = T is the last of the T + 1 rounds of samples.
        per = wasp.demonstrations
        good = {y: [voted.texts[i] for i in idx]
                for y, idx in top_indices(vote.histograms["near"], voted.labels, per).items()}
        bad = {y: [voted.texts[i] for i in idx]
               for y, idx in top_indices(vote.histograms["far"], voted.labels, per).items()}
        sizes = state.sizes[t + 1]
        if wasp.contrastive:
            new = self.gen.contrastive(sizes, state.weights, good, bad, per, f"round{t + 1}")
        else:
            new = self.gen.zero_shot(sizes, f"round{t + 1}", state.weights)
        return pool.extend(new)


class Wasp(PEMethod):
    name = "wasp"
    #: the candidates each vote is on are sized from the released label counts (planning):
    #: a sample of the pool, the release stays every round's samples
    sizes_votes = True
    private_passes = ("embed",)
    section = "wasp"
    config_model = WaspConfig

    def planned_work(self, config: RunConfig, plan: Any, detection_s: float | None
                     ) -> tuple[Work, list[Stage]]:
        """WASP's rounds, its generators and contrastive prompts
        (:func:`dpsynth.work.wasp_work`), and its federated rounds when on."""
        syn, wasp = config.synthesis, self.settings(config)
        shown = 2 * max(1, wasp.demonstrations // 2) if wasp.contrastive else 0
        return (wasp_work(plan.records, syn.samples, syn.iterations, len(config.generators),
                          shown), wasp_stages(wasp.federated.parties, syn.iterations))

    def votes(self, config: RunConfig, n_labels: int) -> VoteShape:
        """A record's Top-Q near votes, sum_{q<Q} 2^-q, under noise of Top-Q's joint
        sensitivity times the multiplier. Vote t is on the pool of rounds 0..t, so the last
        vote sees every round but the last, which is written after it: ``samples - samples
        // (T + 1)`` candidates (WASP has no pool multiplier), or the voting population drawn
        from them when it is smaller (:meth:`WaspStrategy.voters`)."""
        syn, top_q = config.synthesis, self.settings(config).top_q
        return replace(super().votes(config, n_labels), mass=2.0 * (1.0 - 2.0 ** -top_q),
                       noise=topq_sensitivity(top_q), per_member=1,
                       pool=wasp_voted(syn.samples, syn.iterations),
                       whole=(f"rounds 0..{syn.iterations - 1} of {syn.samples}, the pool the "
                              "last vote sees"),
                       drawn="the pool of rounds 0..t")

    @classmethod
    def extras(cls, config: RunConfig) -> list[tuple[str, str, str]]:
        """Federated voting needs Flower and Ray (``[federated]``)."""
        if cls.settings(config).federated.parties > 0:
            return [("flwr", "federated", "wasp.federated"),
                    ("ray", "federated", "wasp.federated")]
        return []

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        super().validate(config, n_records, n_labels)
        fed = self.settings(config).federated
        if fed.parties and config.privacy.unit == "user":
            raise ConfigError("wasp.federated: user-level privacy is not supported in "
                              "federated mode; set privacy.unit to 'record'")
        if fed.parties and config.compute.engine != "local":
            raise ConfigError("wasp.federated simulates its parties in this process: set "
                              "compute.engine to 'local' (each party is its own shard); "
                              "wasp.federated.ray_address runs the parties on a Ray cluster")
        if fed.parties == 1:
            raise ConfigError("wasp.federated.parties must be 0 (off) or at least 2")
        if fed.parties and fed.min_parties is not None and not (
                2 <= fed.min_parties <= fed.parties):
            raise ConfigError(f"wasp.federated.min_parties = {fed.min_parties} must lie in "
                              f"[2, parties = {fed.parties}]")

    def release_plan(self, config: RunConfig, n_labels: int) -> ReleasePlan:
        """Federated votes are planned at their worst-case noise, sigma sqrt(min_parties / P),
        the noise each round is charged with before it runs; their delta outside the
        accountant is the probability that a party's noisy value is clipped at SecAgg+'s
        range C, which the KLS accounting does not model, summed over the rounds
        (:func:`dpsynth.federated.core.round_clip_delta`)."""
        fed = self.settings(config).federated
        if not fed.parties:
            return super().release_plan(config, n_labels)
        plan = vote_release_plan(config, int(n_labels > 1), 0)
        rounds = config.synthesis.iterations
        if not rounds:
            return plan
        from ..federated.core import round_clip_delta

        wasp = self.settings(config)
        sens = topq_sensitivity(wasp.top_q)
        # the rounds' own noise and grid; the dimension at its upper bound
        votes = SecAggRounds(sens, fed.parties, fed.min_parties or fed.parties,
                             2 * config.synthesis.max_candidates, rounds,
                             float(fed.max_records_per_party), topq_grid(wasp.top_q))
        return ReleasePlan((*plan.releases, votes), rounds * round_clip_delta(
            fed.parties, 2 * config.synthesis.max_candidates))

    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, plan: PrivacyPlan) -> WaspStrategy:
        return WaspStrategy(config, view, releaser, gen, rngs,
                            self.votes(config, view.n_labels))

    def statement_extras(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        wasp = self.settings(job.config)
        return {"top_q": wasp.top_q, "topq_sensitivity": topq_sensitivity(wasp.top_q),
                "federated_parties": wasp.federated.parties}
