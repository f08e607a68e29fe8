"""SecPE (Lin et al. 2025, "Private Evolution with secret protection"): protect predefined
secrets instead of whole records, and vote through noisy cluster representatives.
METHODS.md section 3.

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
counts (free), so no private count is released.

Accounting note (where this code is stricter than METHODS.md's dominating pair): a sampled
record moves both the count n~_k (by 1) and the mean e~_k (by at most 2R/n_k, i.e. 1 in units of
its noise scale), so the joint shift is sqrt(2) per sampled record. We therefore calibrate
sigma* for a shift of 1 per record and draw each coordinate's noise with sigma = sqrt(2) sigma*.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..evolution import operators as ops
from ..evolution.loop import Pool
from ..evolution.representatives import JOINT_SENSITIVITY
from ..evolution.selection import allocate, thresholded
from .aug_pe import AugPEStrategy, write_reference
from .base import Method

if TYPE_CHECKING:
    from ..context import RunContext



class SecretPlan:
    """The secret split and its calibrated noise, computed once before any model loads."""

    def __init__(self, config: RunConfig, texts: list[str]) -> None:
        from ..privacy.secret_protection import (
            calibrate_secret_sigma,
            rates_per_secret,
            sampling_rates,
            secret_weights_lp,
        )
        from ..secrets import SecretDefinitionError, find_secrets

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
            from ..privacy.secret_protection import r_to_mu

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
        """Counts only: safe for the run folder and release/privacy.json."""
        return self.index.split_report()


class SecPEStrategy(AugPEStrategy):
    """Aug-PE's selection and variation; representative voting instead of per-record votes."""

    def __init__(self, plan: SecretPlan) -> None:
        super().__init__()
        self.plan = plan
        self._centres: dict[int, tuple[np.ndarray, np.ndarray]] | None = None

    def initial(self, ctx: RunContext) -> Pool:
        syn = ctx.config.synthesis
        report = self.plan.report()
        ctx.log(f"secrets: {report['private_records']} private records (with a secret), "
                f"{report['public_records']} public, {report['secrets']} secrets")
        if not self.plan.protects:
            ctx.log("no record holds a secret that needs protection: no noise is needed for "
                    "secrets, so every record is public and the representatives carry no noise")
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
            emb = ctx.private_embeddings[pub]
            labels = ctx.label_codes[pub]
            per_label = allocate(ctx.config.secpe.clusters,
                                 np.bincount(labels, minlength=ctx.n_labels).astype(float))
            self._centres = {}
            for y in range(ctx.n_labels):
                rows = emb[labels == y]
                if len(rows):
                    k = max(1, int(per_label[y]))
                    self._centres[y] = public_centres(rows, k, seed=ctx.config.privacy.seed)
        return self._centres

    def score(self, ctx: RunContext, t: int, pool: Pool,
              emb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        from ..evolution.representatives import accumulate_private, representative_vote

        centres = self.centres(ctx)
        R = ctx.config.secpe.clip
        priv = self.plan.private_idx
        priv_emb = ctx.private_embeddings[priv]  # once, not per label
        priv_labels = ctx.label_codes[priv]
        sampler = ctx.session.noise_for(f"iter{t}/poisson")  # Poisson coins: mechanism randomness
        # True statistic, in units of each coordinate's noise scale: per label y and centre k,
        # the mean shifted by the sampled private rows, times n_k / (2R), then the counts.
        blocks, layout = [], []
        for y, (cent, sizes) in sorted(centres.items()):
            mask = priv_labels == y
            acc = accumulate_private(cent, [priv_emb[mask]],
                                     self.plan.rates[mask], R, sampler)
            mean = (sizes[:, None] * cent + acc.sums) / (sizes + acc.counts)[:, None]
            blocks.append((mean * (sizes[:, None] / (2 * R))).ravel())
            blocks.append((sizes + acc.counts).astype(np.float64))
            layout.append((y, cent.shape, sizes))
        value = np.concatenate(blocks)
        if self.plan.protects:
            noisy = ctx.session.gaussian(f"iter{t}/representatives", value, JOINT_SENSITIVITY,
                                         self.plan.sigma, name="representatives",
                                         sampling_rate=float(self.plan.rates.max()))
        else:
            noisy = value  # no secret needs protection: representatives are public statistics
        hist = np.zeros(len(pool))
        offset = 0
        for y, (k, d), sizes in layout:
            e_tilde = noisy[offset: offset + k * d].reshape(k, d) * (2 * R / sizes[:, None])
            offset += k * d
            n_tilde = noisy[offset: offset + k]
            offset += k
            idx = np.flatnonzero(pool.labels == y)
            if len(idx):
                hist[idx] += representative_vote(e_tilde.astype(np.float32), n_tilde, emb[idx])
        scores = thresholded(hist, ctx.config.synthesis.threshold * self.plan.sigma)
        return scores, {"noise_sigma": self.plan.sigma, "vote_mass": float(hist.sum()),
                        "representatives": int(sum(s[1][0] for s in layout)),
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
            "noise_sigma": plan.sigma,
            "calibrated_sigma_per_unit_shift": plan.sigma_star,
            "clip_R": cfg.clip,
            "clusters": cfg.clusters,
            "split": plan.report(),
            "per_type": {t: {"p": plan.p, "r": plan.r, "secrets": v["secrets"]}
                         for t, v in plan.report()["per_type"].items()},
            "summary": (f"(p={plan.p:g}, r={plan.r:g}) per secret"
                        if plan.protects else "no secret found: no noise needed for secrets"),
        }
        return {
            "epsilon": None,
            "delta": None,
            "classical_dp": {
                "holds": False,
                "reason": "records without secrets are treated as public and enter the "
                          "cluster centres without noise, so no record-level (epsilon, delta) "
                          "guarantee covers them; only the named secrets are protected",
            },
            "secret_protection": protection,
        }
