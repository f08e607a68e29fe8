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
noise shares arrive) before it runs (dpsynth.federated.rounds).
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..evolution import operators as ops
from ..evolution.loop import Pool
from ..evolution.selection import allocate, top_indices
from ..evolution.textgen import stable_seed
from ..evolution.voting import topq_sensitivity, topq_vote, vote_index_from
from .aug_pe import noisy_quota, write_reference
from .base import Method

if TYPE_CHECKING:
    from ..context import RunContext


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


def worst_case_sigma(sigma: float, min_parties: int, parties: int) -> float:
    """Std of a federated round's noise when only min_parties of the P noise shares arrive:
    sigma * sqrt(min_parties / P) (SecAgg+ cannot unmask a sum of fewer)."""
    return sigma * math.sqrt(min_parties / parties)


def round_sizes(quota: np.ndarray, rounds: int) -> np.ndarray:
    """[rounds, labels]: each label's total split as evenly as possible over the rounds."""
    return np.stack([allocate(int(q), np.ones(rounds)) for q in quota], axis=1)


def dirichlet_parties(n_records: int, parties: int, alpha: float,
                      rng: np.random.Generator) -> list[np.ndarray]:
    """Split record indices over parties with Dirichlet(alpha) proportions (uneven shares);
    every party holds at least one record (a party without records cannot take part)."""
    if n_records < parties:
        raise ValueError(f"{parties} parties need at least {parties} records, got {n_records}")
    shares = rng.dirichlet(np.full(parties, alpha))
    perm = rng.permutation(n_records)
    owner = np.empty(n_records, dtype=np.int64)
    owner[perm[:parties]] = np.arange(parties)
    owner[perm[parties:]] = rng.choice(parties, size=n_records - parties, p=shares)
    return [np.flatnonzero(owner == p) for p in range(parties)]


class WaspStrategy:
    def __init__(self, n_generators: int) -> None:
        self.quota: np.ndarray | None = None
        self.sizes: np.ndarray | None = None
        self.weights = np.full(n_generators, 1.0 / n_generators)
        self.history: list[list[float]] = []
        self._far: np.ndarray | None = None

    def initial(self, ctx: RunContext) -> Pool:
        cfg = ctx.config
        self.quota = noisy_quota(ctx, cfg.synthesis.samples)
        self.sizes = round_sizes(self.quota, cfg.synthesis.iterations + 1)
        pool = ops.zero_shot(ctx, self.sizes[0], "round0", self.weights)
        write_reference(ctx, pool, self.sizes[0])
        return pool

    def _histograms(self, ctx: RunContext, t: int, pool: Pool, emb: np.ndarray) -> np.ndarray:
        wasp = ctx.config.wasp
        sens = topq_sensitivity(wasp.top_q)
        key = f"iter{t}/topq"
        if wasp.federated.parties == 0:
            hist = ctx.compute.topq_histograms(emb, pool.labels, wasp.top_q,
                                               index=vote_index_from(ctx.config.synthesis))
            return ctx.release_gaussian(key, hist, sens, name="topq_votes")
        return self._federated(ctx, key, pool, emb, sens)

    def _federated(self, ctx: RunContext, key: str, pool: Pool, emb: np.ndarray,
                   sens: float) -> np.ndarray:
        """Parties add N(0, sigma^2 / P) each; only the SecAgg+ sum reaches this process.

        The round is charged at its worst case (only min_parties noise shares arrive, and
        SecAgg+ cannot unmask with fewer) and that charge is committed before any party is
        contacted (federated.rounds.accounted_round)."""
        from ..federated import PartyData, federated_noisy_histogram
        from ..federated.rounds import accounted_round
        from ..privacy import GaussianEvent

        fed = ctx.config.wasp.federated
        min_parties = fed.min_parties or fed.parties
        sigma = ctx.sigma * sens
        event = GaussianEvent(sigma=worst_case_sigma(sigma, min_parties, fed.parties),
                              sensitivity=sens, name="topq_votes")

        def run_round() -> np.ndarray:
            split = dirichlet_parties(len(ctx.dataset), fed.parties, fed.dirichlet_alpha,
                                      ctx.rng_for("parties"))
            parties = [PartyData(ctx.private_embeddings[idx], ctx.label_codes[idx])
                       for idx in split]
            result = federated_noisy_histogram(
                parties, emb, pool.labels, partial(topq_vote, q=ctx.config.wasp.top_q), sigma,
                seed=None if ctx.config.privacy.noise == "secure"
                else stable_seed(ctx.seed, "federated", key),  # the run's private seed
                noise_mode=ctx.config.privacy.noise, min_parties=min_parties,
            )
            ctx.log(f"federated round {key}: {result.parties_present} of {fed.parties} parties")
            return result.histogram

        return accounted_round(ctx.session, key, event, run_round,
                               ctx.run.private / "federated")

    def score(self, ctx: RunContext, t: int, pool: Pool,
              emb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        noisy = self._histograms(ctx, t, pool, emb)
        n = len(pool)
        near, self._far = noisy[:n], noisy[n:]
        names = [s.name for s in ctx.synthesizers]
        pos = np.maximum(near, 0)
        share = np.bincount(pool.sources, weights=pos, minlength=len(names))
        share = share / share.sum() if share.sum() > 0 else share
        return near, {
            "noise_sigma": ctx.sigma * topq_sensitivity(ctx.config.wasp.top_q),
            "vote_mass": float(near.sum()),
            "generator_weights": dict(zip(names, self.weights.round(4).tolist(), strict=True)),
            "generator_vote_share": dict(zip(names, share.round(4).tolist(), strict=True)),
        }

    def advance(self, ctx: RunContext, t: int, pool: Pool, emb: np.ndarray, scores: np.ndarray,
                last: bool) -> Pool:
        wasp = ctx.config.wasp
        if wasp.weighting:
            self.weights = generator_weights(scores, pool.sources, len(self.weights),
                                             wasp.weight_temperature)
        self.history.append(self.weights.tolist())
        # After the last vote too: round t + 1 = T is the last of the T + 1 rounds of samples.
        per = wasp.demonstrations
        good = {y: [pool.texts[i] for i in idx]
                for y, idx in top_indices(scores, pool.labels, per).items()}
        bad = {y: [pool.texts[i] for i in idx]
               for y, idx in top_indices(self._far, pool.labels, per).items()}
        sizes = self.sizes[t + 1]
        if wasp.contrastive:
            new = ops.contrastive(ctx, sizes, self.weights, good, bad, per, f"round{t + 1}")
        else:
            new = ops.zero_shot(ctx, sizes, f"round{t + 1}", self.weights)
        return pool.extend(new)

    def finalize(self, ctx: RunContext, pool: Pool) -> Pool:
        return pool

    def state(self) -> dict[str, Any]:
        return {
            "quota": None if self.quota is None else self.quota.tolist(),
            "sizes": None if self.sizes is None else self.sizes.tolist(),
            "weights": self.weights.tolist(),
            "history": self.history,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.quota = None if state["quota"] is None else np.asarray(state["quota"])
        self.sizes = None if state["sizes"] is None else np.asarray(state["sizes"])
        self.weights = np.asarray(state["weights"])
        self.history = state["history"]


class Wasp(Method):
    name = "wasp"

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        super().validate(config, n_records, n_labels)
        fed = config.wasp.federated
        if fed.parties and config.privacy.unit == "user":
            raise ConfigError("wasp.federated: user-level privacy is not supported in "
                              "federated mode; set privacy.unit to 'record'")
        if fed.parties and config.compute.engine != "local":
            raise ConfigError("wasp.federated simulates its parties in this process: set "
                              "compute.engine to 'local' (each party is its own shard)")
        if fed.parties == 1:
            raise ConfigError("wasp.federated.parties must be 0 (off) or at least 2")
        if fed.parties and fed.min_parties is not None and not (
                2 <= fed.min_parties <= fed.parties):
            raise ConfigError(f"wasp.federated.min_parties = {fed.min_parties} must lie in "
                              f"[2, parties = {fed.parties}]")

    def planned_events(self, config: RunConfig, n_labels: int, sigma: float) -> list[Any]:
        """Federated votes are planned at their worst-case noise, sigma sqrt(min_parties / P),
        the noise each round is charged with before it runs."""
        fed = config.wasp.federated
        if not fed.parties:
            return super().planned_events(config, n_labels, sigma)
        from ..privacy import GaussianEvent

        events = [GaussianEvent(sigma=sigma, sensitivity=1.0, name="label_counts")] \
            if n_labels > 1 else []
        rounds = config.synthesis.iterations
        if rounds:
            worst = worst_case_sigma(sigma, fed.min_parties or fed.parties, fed.parties)
            events.append(GaussianEvent(sigma=worst, sensitivity=1.0, count=rounds,
                                        name="topq_votes"))
        return events

    def strategy(self, ctx: RunContext) -> WaspStrategy:
        return WaspStrategy(len(ctx.config.generators))

    def statement_extras(self, ctx: RunContext) -> dict[str, Any]:
        return {"top_q": ctx.config.wasp.top_q,
                "topq_sensitivity": topq_sensitivity(ctx.config.wasp.top_q),
                "federated_parties": ctx.config.wasp.federated.parties}
