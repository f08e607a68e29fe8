"""SecPE (Lin et al. 2025, "Private Evolution with secret protection"): protect predefined
secrets instead of whole records, and vote through noisy cluster representatives.
docs/methods.md §3.

- Records that contain a secret are private; the others are public and used freely.
- (p, r)-secret protection: a mu-GDP mechanism gives r_j = 1 - Phi(Phi^-1(1 - p_j) - mu), so
  the budget per secret is eta_j = Phi^-1(1 - p_j) - Phi^-1(1 - r_j).
- SecretNoise: an LP gives record weights w_i, sampling rates rho_i follow; sigma is the
  smallest noise with blow-up B_j(p_j) <= r_j for every secret j (dominating pair of a
  Poisson-binomial mixture of Gaussians over T iterations).
- Per iteration, per label: public KMeans centres (n_k, e_k) are shifted by the clipped,
  Poisson-sampled private embeddings; e~_k and n~_k are released with Gaussian noise, and each
  representative gives n~_k to its nearest candidate: O(K N) instead of O(M N).
Selection and variation are Aug-PE's. Label quotas come from the public records' label
counts (free), so no private count is released; the exact private/public split goes to the run's
private/diagnostics.jsonl only.

Accounting note (where this code is stricter than docs/methods.md §3's dominating pair): a
sampled record moves both the count n~_k (by 1) and the mean e~_k (by at most
Delta_k = (R + max(1, R)) / n_k, i.e. 1 in units of its noise scale; derivation in
representatives.RepresentativeNoise), so the joint shift is sqrt(2) per sampled record. We
therefore calibrate sigma* for a shift of 1 per record and draw each coordinate's noise with
sigma = sqrt(2) sigma*. The release itself is representatives.release_representatives.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ...config import ConfigError, RunConfig
from ...context import PrivateView, Releaser, Rngs
from ...diagnostics import append_diagnostic
from ...evolution.operators import Generation
from ...evolution.parts import reference_set, select_and_vary
from ...evolution.pool import Pool
from ...evolution.selection import allocate, split_weights, thresholded
from ...evolution.strategy import Start, StrategyState, VoteResult
from ...planning import VoteShape
from ...privacy import ReleasePlan
from ...work import Stage, Work, secpe_stages, secpe_work
from ..base import Guarantee, Job, Outcome, PrivacyPlan
from ..pe import PEMethod, vote_release_plan
from . import statistics
from .config import SecPEConfig
from .plan import SecretPlan
from .representatives import JOINT_SENSITIVITY

if TYPE_CHECKING:
    from ...compute.sharded import ShardedDataset
    from ...data import Dataset
    from ...planning import PlanInputs
    from ...run_folder import RunDir


def discretisation_tv(session: Any) -> float:
    """Sum over the run's representative releases of the total variation bound between the
    discrete release and the continuous one it was calibrated for (docs/methods.md §3): each
    release's rounded sensitivity sqrt(2) + g sqrt(d) gives back its d."""
    from ...privacy import DiscreteGaussianEvent
    from ...privacy.lattice import rounding_tv_bound

    total = 0.0
    for key in session.store.records:
        for ev in session.store.events(key):
            if not isinstance(ev, DiscreteGaussianEvent) or ev.name != "representatives":
                continue
            g = ev.grid
            d = round(((ev.sensitivity - JOINT_SENSITIVITY) / g) ** 2)
            total += ev.count * rounding_tv_bound(ev.sigma, g, max(d, 1))
    return total


class SecPEStrategy:
    """SecPE's parts for the shared loop: quotas from the public records, representative
    voting, and the shared selection with variation."""

    def __init__(self, config: RunConfig, secrets: SecretPlan, view: PrivateView,
                 releaser: Releaser, gen: Generation, rngs: Rngs) -> None:
        self.syn = config.synthesis
        self.secpe: SecPEConfig = SecPE.settings(config)
        self.centre_seed = int(config.privacy.seed or 0)  # public data: any fixed seed
        self.secrets = secrets
        self.view = view
        self.releaser = releaser
        self.gen = gen
        self.rngs = rngs
        self.state = StrategyState()
        self._centres: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._public_norm = 1.0
        self._public_labels: np.ndarray | None = None
        self._private_per_label: np.ndarray | None = None
        self._rates_ready = False

    def public_labels(self) -> np.ndarray:
        """Label codes of the public rows (records without a secret: SecPE treats them as
        public), from the engine; the labels of records holding a secret are never fetched."""
        if self._public_labels is None:
            self._public_labels = np.asarray(
                statistics.public_labels(self.view.compute, self.secrets.public_idx),
                dtype=np.int64)
        return self._public_labels

    def initial(self) -> Start:
        view, plan = self.view, self.secrets
        append_diagnostic(view.run, {"kind": "secpe_split", **plan.report(),
                                     **plan.noise_report()})
        view.log(f"secret protection: {plan.summary()} (secret split counts in "
                 "private/diagnostics.jsonl)")
        counts = np.bincount(self.public_labels(), minlength=view.n_labels).astype(np.float64)
        # public: free (no noise, so nothing to shrink)
        quota = allocate(self.syn.samples, split_weights(counts, 0.0, self.syn.label_split))
        self.state.quota = quota
        pool = self.gen.zero_shot(quota * self.syn.pool_multiplier, "init")
        return Start(pool, reference_set(pool, quota, self.rngs))

    def centres(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Public KMeans centres per label, K split over labels by public counts (free); a
        deterministic function of public rows, computed once per process."""
        if self._centres is None:
            from .representatives import public_centres

            view = self.view
            pub = self.secrets.public_idx
            emb = statistics.public_embeddings(view.compute, pub)  # public rows (no secret)
            labels = self.public_labels()
            # public rows: their largest norm bounds the centres (1 for unit embeddings)
            self._public_norm = max(1.0, float(np.linalg.norm(emb, axis=1).max()))
            per_label = allocate(self.secpe.clusters,
                                 np.bincount(labels, minlength=view.n_labels).astype(float))
            self._centres = {}
            for y in range(view.n_labels):
                rows = emb[labels == y]
                if len(rows):
                    k = max(1, int(per_label[y]))
                    self._centres[y] = public_centres(rows, k, seed=self.centre_seed)
        return self._centres

    def vote(self, t: int, pool: Pool, emb: np.ndarray) -> VoteResult:
        from .representatives import (
            PrivateAccumulation,
            RepresentativeGroup,
            RepresentativeNoise,
            release_representatives,
            representative_vote,
        )

        view, plan = self.view, self.secrets
        centres = self.centres()
        R = self.secpe.clip
        if not self._rates_ready:  # the shards hold their rows' rates (or reload them)
            if not statistics.rates_ready(view.compute, plan.digest):
                raise RuntimeError("SecPE's sampling rates are not on this compute engine: "
                                   "plan with the engine that votes, or in the run's folder")
            self._rates_ready = True
        # Poisson coins: mechanism randomness, from the key's own stream of the session, one
        # uniform per record in row order (public rows have rate 0), shipped as one shared
        # object; the engine (this process or the Ray shards) takes row i iff coins[i] < its
        # rate and sums the clipped sampled rows per centre, exactly
        coins = np.asarray(self.releaser.noise_for(f"iter{t}/poisson").uniform(len(view)))
        sums = statistics.centre_sums(view.compute, {y: c for y, (c, _) in centres.items()},
                                      coins, R, len(view))
        if self._private_per_label is None:  # private rows per label (fixed): exact, private
            mask = np.ones(len(view), dtype=bool)
            mask[plan.public_idx] = False  # records holding a secret
            self._private_per_label = statistics.masked_label_counts(view.compute, mask,
                                                                     view.n_labels)
        labels, groups = [], []
        for y, (cent, sizes) in sorted(centres.items()):
            acc = PrivateAccumulation(sums=sums[y][0], counts=sums[y][1],
                                      n_seen=int(self._private_per_label[y]),
                                      n_sampled=int(sums[y][1].sum()))
            labels.append(y)
            groups.append(RepresentativeGroup(cent, sizes, acc))
        noise = RepresentativeNoise(clip_R=R, sigma=plan.sigma, public_norm=self._public_norm)
        reps = release_representatives(self.releaser.session, f"iter{t}/representatives",
                                       groups, noise, sampling_rate=plan.max_rate)
        released = dict(zip(labels, reps, strict=True))
        hist = np.zeros(len(pool))
        for y, rep in released.items():
            idx = np.flatnonzero(pool.labels == y)
            if len(idx):
                hist[idx] += representative_vote(rep.e_tilde, rep.n_tilde, emb[idx])
        scores = thresholded(hist, self.syn.threshold * plan.sigma)
        return VoteResult(scores, {"votes": hist}, {
            "vote_mass": float(hist.sum()),
            "representatives": int(sum(len(r.n_tilde) for r in reps)),
            "candidates_with_votes": int((scores > 0).sum())}, released=released)

    def next(self, t: int, pool: Pool, vote: VoteResult, last: bool) -> Pool:
        assert self.state.quota is not None
        return select_and_vary(self.gen, self.rngs, self.syn, t, pool, vote.scores,
                               self.state.quota, last)


class SecPE(PEMethod):
    name = "secpe"
    private_passes = ("secrets", "embed")
    section = "secpe"
    config_model = SecPEConfig

    def planned_work(self, config: RunConfig, plan: Any, detection_s: float | None
                     ) -> tuple[Work, list[Stage]]:
        """SecPE's pool (:func:`dpsynth.work.secpe_work`), the secret detection as long as
        the plan's own took (``detection_s``) and the public KMeans."""
        syn = config.synthesis
        return (secpe_work(plan.records, syn.samples, syn.pool_multiplier, syn.iterations),
                secpe_stages(plan.records, self.settings(config).clusters, detection_s,
                             syn.iterations))

    def votes(self, config: RunConfig, n_labels: int) -> VoteShape:
        """A record's mass in its cluster's noisy count, 1, goes to the nearest candidate
        (:mod:`dpsynth.planning`)."""
        return replace(super().votes(config, n_labels), mass=1.0)

    @classmethod
    def extras(cls, config: RunConfig) -> list[tuple[str, str, str]]:
        """Secrets of kind 'pii' are found by Presidio (``[secpe]``)."""
        if any(isinstance(s, dict) and s.get("kind") == "pii"
               for s in cls.settings(config).secrets):
            return [("presidio_analyzer", "secpe", "secpe secrets of kind 'pii'")]
        return []

    def plan_inputs(self, config: RunConfig, dataset: Dataset | ShardedDataset, run: RunDir
                    ) -> PlanInputs:
        """The shared facts, and the secret plan: secrets detected and the noise calibrated
        (or the plan the run saved in private/ reused: a resumed run does not solve the LP
        again); its noise std of each released coordinate is the plan's ``sigma``, the secret
        plan itself goes to the strategy and the statement in ``notes["secrets"]``."""
        secrets = SecretPlan.build(config, dataset, run.private)
        return replace(super().plan_inputs(config, dataset, run), sigma=secrets.sigma,
                       notes={"secrets": secrets})

    def guarantee(self, config: RunConfig) -> Guarantee:
        """(p, r)-secret protection; nothing with epsilon = inf."""
        return "none" if math.isinf(config.privacy.epsilon) else "secret-protection"

    def ledger_details(self, config: RunConfig) -> dict[str, Any]:
        cfg = self.settings(config)
        if self.guarantee(config) == "none":
            return {"method": self.name}
        return {"method": self.name, "p": cfg.p, "r": cfg.p * cfg.r_over_p}

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        super().validate(config, n_records, n_labels)
        if config.privacy.unit != "record":
            raise ConfigError("secpe protects secrets, not users: set privacy.unit to 'record'")

    def release_plan(self, config: RunConfig, n_labels: int) -> ReleasePlan:
        """The T votes through the representatives; the label counts are public here (the
        records without a secret)."""
        return vote_release_plan(config, 0, config.synthesis.iterations)

    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, plan: PrivacyPlan) -> SecPEStrategy:
        return SecPEStrategy(config, plan.notes["secrets"], view, releaser, gen, rngs)

    def guarantee_statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        if self.guarantee(job.config) == "none":
            return super().guarantee_statement(job, outcome)
        p = job.config.privacy
        return {"target_epsilon": None, "target_delta": None, "unit": p.unit,
                "accountant": "secret-protection", "noise": p.noise,
                "mechanisms": job.session.accountant.summary()}

    def statement_extras(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        plan: SecretPlan = job.plan.notes["secrets"]
        cfg = self.settings(job.config)
        protection = {
            "definition": "(p, r)-secret protection (SecPE): for every secret s_j and every "
                          "reconstruction attack, Pr[attack outputs s_j] <= r_j; p_j is the "
                          "prior success rate. This is not differential privacy.",
            "p": plan.p,
            "r": plan.r,
            "r_over_p": cfg.r_over_p,
            "iterations": job.config.synthesis.iterations,
            "noise_scale": "calibrated by SecretNoise from the secrets found in the private "
                           "data; kept in private/diagnostics.jsonl, not released",
            "clip_R": cfg.clip,
            "clusters": cfg.clusters,
            # the configured definitions by kind and name only (a 'strings' list holds secrets)
            "secret_definitions": [{"kind": d.get("kind"), "name": d.get("name")}
                                   for d in cfg.secrets],
            "summary": plan.summary(),
            "discrete_noise": "the centres are released on the 2^-32 grid with exact discrete "
                              "Gaussian noise; r is computed for continuous noise and holds up "
                              "to + T eta, eta the total variation bound of docs/methods.md §3 "
                              "(its value, which depends on the noise scale, is in "
                              "private/diagnostics.jsonl)",
        }
        append_diagnostic(job.run, {"kind": "secpe_discretisation",
                                    "tv_bound_total": discretisation_tv(job.session)})
        return {
            "epsilon": None,
            "delta": None,
            "noise_multiplier": None,  # data-dependent (SecretNoise): diagnostics only
            # names and counts only: the events' noise parameters are data-dependent
            "mechanisms": [{"name": m.get("name"), "count": m.get("count")}
                           for m in job.session.accountant.summary()],
            "classical_dp": {
                "holds": False,
                "reason": "records without secrets are treated as public and enter the "
                          "cluster centres without noise, so no record-level (epsilon, delta) "
                          "guarantee covers them; only the named secrets are protected",
            },
            "secret_protection": protection,
        }
