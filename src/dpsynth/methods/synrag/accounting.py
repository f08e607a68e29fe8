"""Theorem 1 of DP-SynRAG (overlapping parallel composition in zCDP) and the calibration of c.

rho = K / (2 sigma_h^2) + L (eps_theta^2 / 8 + 1 / (2 sigma_mu^2) + (T / 2) (c / tau)^2),
eps = rho + sqrt(4 rho log(1/delta)) (the accountant reports the tighter CKS 2020 conversion).

Each document is in at most L clusters, so for the worst-case document the per-cluster
releases compose L times, not R times: the cluster releases are charged ONCE in the run's
session as ``overlapping(event, L)`` events (:func:`cluster_events`), and the per-cluster draws
themselves are kept in a separate keyed store (resume-safe) whose own accountant is not the
statement.
"""

from __future__ import annotations

import math

from ...config import ConfigError
from ...privacy import (
    Accountant,
    DiscreteGaussianEvent,
    ExponentialEvent,
    ZCDPEvent,
    overlapping,
    zcdp_to_eps_standard,
)
from .clusters import histogram_sigma
from .config import SynRAGConfig, max_private_tokens
from .retrieval import centre_sigma


def theorem1_rho(k: int, sigma_h: float, overlap: int, eps_theta: float, sigma_mu: float,
                 tokens: int, clip: float, temperature: float, svt_epsilon: float = 0.0) -> float:
    """Closed form of Theorem 1 (zCDP rho of the whole build). With the public shortcut,
    ``tokens`` is m (private tokens) and each adds svt_epsilon^2 / 2 for its SVT instance."""
    per_cluster = (eps_theta**2 / 8 + 1 / (2 * sigma_mu**2)
                   + tokens / 2 * ((clip / temperature)**2 + svt_epsilon**2))
    return k / (2 * sigma_h**2) + overlap * per_cluster


def theorem1_epsilon(rho: float, delta: float) -> float:
    """eps = rho + sqrt(4 rho log(1/delta)) (Bun & Steinke 2016)."""
    return zcdp_to_eps_standard(rho, delta)


def histogram_event(cfg: SynRAGConfig) -> DiscreteGaussianEvent:
    """The keyword histogram: discrete Gaussian on the integers, L2 sensitivity sqrt(K) (one
    document adds 1 to at most K distinct terms: shift profile (1,) * K)."""
    k = cfg.keywords_per_doc
    return DiscreteGaussianEvent(histogram_sigma(k, cfg.rho_hist), math.sqrt(k), 1, 1.0,
                                 "keyword_histogram", shifts=(1,) * k)


def cluster_events(cfg: SynRAGConfig, clip: float, overlap: int | None = None,
                   retrieval: bool = True) -> list:
    """The per-cluster releases, composed over the L clusters a document may be in."""
    lcount = cfg.overlap if overlap is None else overlap
    token = ZCDPEvent(0.5 * (clip / cfg.temperature) ** 2, max_private_tokens(cfg),
                      "private_token")
    events = []
    if cfg.public_shortcut:  # m AboveThreshold instances, each eps-DP = eps^2/2-zCDP
        events.append(overlapping(ZCDPEvent(0.5 * cfg.svt_epsilon**2, max_private_tokens(cfg),
                                            "svt"), lcount))
    if retrieval:
        events += [
            overlapping(DiscreteGaussianEvent(centre_sigma(cfg.rho_centre), 1.0, 1, 1.0,
                                              "cluster_centre"), lcount),
            overlapping(ExponentialEvent(cfg.eps_theta, 1, "cluster_threshold"), lcount),
        ]
    events.append(overlapping(token, lcount))
    return events


def planned_events(cfg: SynRAGConfig, clip: float) -> list:
    """All events of a DP-SynRAG build (Theorem 1)."""
    return [histogram_event(cfg), *cluster_events(cfg, clip)]


def calibrate_clip(epsilon: float, delta: float, events_for_clip, *, kind: str = "zcdp",
                   hi: float = 100.0) -> float:
    """Largest c (to 1e-9 relative) whose planned events meet (epsilon, delta) with the
    accountant of ``kind``; a clear error when the fixed parts alone exceed the target."""
    def eps_at(c: float) -> float:
        acc = Accountant(kind)
        acc.extend(events_for_clip(c))
        return acc.epsilon(delta)

    lo = 1e-9
    if eps_at(lo) > epsilon:
        raise ConfigError(
            f"the fixed releases (keyword histogram, cluster centres and thresholds) already "
            f"take epsilon to {eps_at(lo):.4f} > target {epsilon:g} at delta={delta:g}: lower "
            "synrag.rho_hist, synrag.rho_centre, synrag.eps_theta or synrag.overlap"
        )
    if eps_at(hi) <= epsilon:
        return hi
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if eps_at(mid) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-9:
            break
    return lo


def resolve_clip(cfg: SynRAGConfig, epsilon: float, delta: float) -> float:
    """c from the config, checked against the target, or calibrated to meet it."""
    if math.isinf(epsilon):
        raise ConfigError("DP-SynRAG needs a finite privacy.epsilon (it has no non-private mode)")
    if cfg.clip is not None:
        acc = Accountant("zcdp")
        acc.extend(planned_events(cfg, cfg.clip))
        got = acc.epsilon(delta)
        if got > epsilon * (1 + 1e-9):
            raise ConfigError(
                f"synrag.clip = {cfg.clip:g} takes epsilon to {got:.4f} > target {epsilon:g}: "
                "lower it or leave it out to calibrate it"
            )
        return float(cfg.clip)
    return calibrate_clip(epsilon, delta, lambda c: planned_events(cfg, c))
