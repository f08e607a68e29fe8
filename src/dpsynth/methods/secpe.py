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
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..diagnostics import append_diagnostic
from ..evolution import operators as ops
from ..evolution.loop import Pool
from ..evolution.representatives import JOINT_SENSITIVITY, NoisyRepresentatives
from ..evolution.selection import allocate, thresholded
from .aug_pe import AugPEStrategy, write_reference
from .base import Method

if TYPE_CHECKING:
    from ..context import RunContext


class SecretPlan:
    """The secret split and its calibrated noise, computed once before any model loads."""

    def __init__(self, config: RunConfig, texts: list[str]) -> None:
        from ..secrets import SecretDefinitionError, find_secrets
        from .secpe_theory import (
            calibrate_secret_sigma,
            rates_per_secret,
            sampling_rates,
            secret_weights_lp,
        )

        cfg = config.secpe
        try:
            self.index = find_secrets(texts, cfg.secrets)
        except (SecretDefinitionError, ValueError) as err:
            raise ConfigError(f"secpe.secrets: {err}") from None
        self.private_idx, self.public_idx = self.index.split()
        if len(self.public_idx) == 0:
            raise ConfigError("secpe.secrets match every record: no public records remain for "
                              "the public clustering; narrow the secret definitions")
        self.p = cfg.p
        self.r = min(1.0, cfg.p * cfg.r_over_p)
        self.rates = np.zeros(len(self.private_idx))
        self.sigma_star = 0.0
        if not self.index.no_secrets and math.isfinite(cfg.r_over_p) and self.r < 1.0:
            from .secpe_theory import r_to_mu

            membership = self.index.private_membership()
            eta = np.full(membership.shape[1], float(r_to_mu(self.p, self.r)))
            weights = secret_weights_lp(membership, eta)
            self.rates = sampling_rates(weights)
            self.sigma_star, _ = calibrate_secret_sigma(
                self.p, self.r, rates_per_secret(membership, self.rates),
                config.synthesis.iterations)
        elif not self.index.no_secrets:
            self.rates = np.ones(len(self.private_idx))  # r/p = inf: no protection asked
        self.sigma = JOINT_SENSITIVITY * self.sigma_star

    @property
    def protects(self) -> bool:
        return self.sigma > 0

    def report(self) -> dict[str, Any]:
        """Exact counts of the split: derived from the private data, so for
        private/diagnostics.jsonl only (never release/ or the log)."""
        return self.index.split_report()

    def summary(self) -> str:
        """What protection the run gives, for privacy.json: from public parameters only (that
        no record holds a secret is a fact about the private data: diagnostics only)."""
        if self.r < 1:
            return f"(p={self.p:g}, r={self.r:g}) per secret"
        return (f"no protection asked (r = min(1, p * r_over_p) = {self.r:g}): records holding "
                "secrets enter the representatives without noise")

    def noise_report(self) -> dict[str, Any]:
        """The calibrated noise, for private/diagnostics.jsonl only: SecretNoise calibrates it
        from the secrets found in the private data, so it is not released."""
        return {"noise_sigma": self.sigma, "calibrated_sigma_per_unit_shift": self.sigma_star,
                "no_secret_found": bool(self.index.no_secrets)}


class SecPEStrategy(AugPEStrategy):
    """Aug-PE's selection and variation; representative voting instead of per-record votes."""

    def __init__(self, plan: SecretPlan) -> None:
        super().__init__()
        self.plan = plan
        self._centres: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
        self._public_norm = 1.0
        #: the last iteration's released (noisy) representatives per label
        self.released: dict[int, NoisyRepresentatives] = {}

    def initial(self, ctx: RunContext) -> Pool:
        syn = ctx.config.synthesis
        append_diagnostic(ctx.run, {"kind": "secpe_split", **self.plan.report(),
                                    **self.plan.noise_report()})
        ctx.log(f"secret protection: {self.plan.summary()} (secret split counts in "
                "private/diagnostics.jsonl)")
        pub = self.plan.public_idx
        counts = np.bincount(ctx.label_codes[pub], minlength=ctx.n_labels)
        self.quota = allocate(syn.samples, counts.astype(np.float64))  # public: free
        pool = ops.zero_shot(ctx, self.quota * syn.pool_multiplier, "init")
        write_reference(ctx, pool, self.quota)
        return pool

    def centres(self, ctx: RunContext) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Public KMeans centres per label, K split over labels by public counts (free)."""
        if self._centres is None:
            from ..evolution.representatives import public_centres

            pub = self.plan.public_idx
            emb = ctx.compute.public_embeddings(pub)  # public rows (no secret)
            labels = ctx.label_codes[pub]
            # public rows: their largest norm bounds the centres (1 for unit embeddings)
            self._public_norm = max(1.0, float(np.linalg.norm(emb, axis=1).max()))
            per_label = allocate(ctx.config.secpe.clusters,
                                 np.bincount(labels, minlength=ctx.n_labels).astype(float))
            self._centres = {}
            for y in range(ctx.n_labels):
                rows = emb[labels == y]
                if len(rows):
                    k = max(1, int(per_label[y]))
                    seed = int(ctx.config.privacy.seed or 0)  # public data: any fixed seed
                    self._centres[y] = public_centres(rows, k, seed=seed)
        return self._centres

    def score(self, ctx: RunContext, t: int, pool: Pool,
              emb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        from ..evolution.representatives import (
            PrivateAccumulation,
            RepresentativeGroup,
            RepresentativeNoise,
            release_representatives,
            representative_vote,
        )

        centres = self.centres(ctx)
        R = ctx.config.secpe.clip
        priv = self.plan.private_idx
        priv_labels = ctx.label_codes[priv]
        sampler = ctx.session.noise_for(f"iter{t}/poisson")  # Poisson coins: mechanism randomness
        # the coins are drawn here, by the session, label by label; the engine (this process
        # or the Ray shards) sums the clipped sampled rows per centre, exactly
        take = np.zeros(len(ctx.dataset), dtype=bool)
        for y in sorted(centres):
            mask = priv_labels == y
            if mask.any():
                take[priv[mask]] = np.asarray(sampler.uniform(int(mask.sum()))) < \
                    self.plan.rates[mask]
        sums = ctx.compute.centre_sums({y: c for y, (c, _) in centres.items()}, take, R,
                                       len(ctx.dataset))
        labels, groups = [], []
        for y, (cent, sizes) in sorted(centres.items()):
            mask = priv_labels == y
            acc = PrivateAccumulation(sums=sums[y][0], counts=sums[y][1], n_seen=int(mask.sum()),
                                      n_sampled=int(take[priv[mask]].sum()))
            labels.append(y)
            groups.append(RepresentativeGroup(cent, sizes, acc))
        plan = RepresentativeNoise(clip_R=R, sigma=self.plan.sigma, public_norm=self._public_norm)
        rate = float(self.plan.rates.max()) if len(self.plan.rates) else 1.0
        reps = release_representatives(ctx.session, f"iter{t}/representatives", groups, plan,
                                       sampling_rate=rate)
        self.released = dict(zip(labels, reps, strict=True))
        hist = np.zeros(len(pool))
        for y, rep in self.released.items():
            idx = np.flatnonzero(pool.labels == y)
            if len(idx):
                hist[idx] += representative_vote(rep.e_tilde, rep.n_tilde, emb[idx])
        scores = thresholded(hist, ctx.config.synthesis.threshold * self.plan.sigma)
        return scores, {"vote_mass": float(hist.sum()),
                        "representatives": int(sum(len(r.n_tilde) for r in reps)),
                        "candidates_with_votes": int((scores > 0).sum())}


class SecPE(Method):
    name = "secpe"
    dp_guarantee = False

    def __init__(self) -> None:
        self.plan: SecretPlan | None = None

    def validate(self, config: RunConfig, n_records: int, n_labels: int) -> None:
        super().validate(config, n_records, n_labels)
        if config.privacy.unit != "record":
            raise ConfigError("secpe protects secrets, not users: set privacy.unit to 'record'")

    def prepare(self, config: RunConfig, dataset: Any) -> float:
        """Detect secrets and calibrate; returns the noise std of each released coordinate."""
        self.plan = SecretPlan(config, dataset.texts)
        return self.plan.sigma

    def vote_releases(self, config: RunConfig, n_labels: int) -> int:
        return config.synthesis.iterations

    def strategy(self, ctx: RunContext) -> SecPEStrategy:
        assert self.plan is not None, "prepare() runs before the loop"
        return SecPEStrategy(self.plan)

    def statement_extras(self, ctx: RunContext) -> dict[str, Any]:
        plan = self.plan
        assert plan is not None
        cfg = ctx.config.secpe
        protection = {
            "definition": "(p, r)-secret protection (SecPE): for every secret s_j and every "
                          "reconstruction attack, Pr[attack outputs s_j] <= r_j; p_j is the "
                          "prior success rate. This is not differential privacy.",
            "p": plan.p,
            "r": plan.r,
            "r_over_p": cfg.r_over_p,
            "iterations": ctx.config.synthesis.iterations,
            "noise_scale": "calibrated by SecretNoise from the secrets found in the private "
                           "data; kept in private/diagnostics.jsonl, not released",
            "clip_R": cfg.clip,
            "clusters": cfg.clusters,
            # the configured definitions by kind and name only (a 'strings' list holds secrets)
            "secret_definitions": [{"kind": d.get("kind"), "name": d.get("name")}
                                   for d in cfg.secrets],
            "summary": plan.summary(),
        }
        return {
            "epsilon": None,
            "delta": None,
            "noise_multiplier": None,  # data-dependent (SecretNoise): diagnostics only
            # names and counts only: the events' noise parameters are data-dependent
            "mechanisms": [{"name": m.get("name"), "count": m.get("count")}
                           for m in ctx.session.accountant.summary()],
            "classical_dp": {
                "holds": False,
                "reason": "records without secrets are treated as public and enter the "
                          "cluster centres without noise, so no record-level (epsilon, delta) "
                          "guarantee covers them; only the named secrets are protected",
            },
            "secret_protection": protection,
        }
