"""The distributed discrete Gaussian: parties' noise shares for a secure sum (docs/methods.md §0).

Kairouz, Liu & Steinke 2021 ("The Distributed Discrete Gaussian Mechanism for Federated Learning
with Secure Aggregation", KLS below). Each of P parties holds a statistic on a public lattice
``grid * Z^d`` (exact: its records' contributions already lie on it, e.g. WASP's votes times
2^(Q-1)), adds its own share Z_p ~ N_Z(0, s^2)^d, s = sigma_party / grid, and sends the
integers n_p + Z_p to the secure sum (SecAgg+ adds integers mod 2^k exactly). The server gets
sum_p n_p + sum_p Z_p and scales it by ``grid``. A sum of discrete Gaussians is not a discrete
Gaussian; KLS bound its Renyi divergence (Theorem 1 / Prop. 14):

    RDP(alpha) <= min(alpha eps^2 / 2 + tau d, (alpha / 2)(eps + tau sqrt(d))^2),
    eps = Delta / (sqrt(P) s),  tau = 10 sum_{k=1}^{P-1} exp(-2 pi^2 s^2 k / (k + 1)),

Delta the L2 sensitivity in lattice steps. :class:`DistributedDiscreteGaussianEvent` is that
charge (accountants: :func:`dpsynth.privacy.accountant.ddgauss_rdp` / ``ddgauss_rho``). A round
is charged at its worst case: only the fewest parties whose shares can be in the sum (with
SecAgg+, its reconstruction threshold ``min_parties``) contribute noise.

Federated WASP uses it (``dpsynth.federated.core.party_submission``): a party's clipped votes
lie on SecAgg+'s grid, it adds ``party_share(local, grid, share_sigma(sigma, parties),
noise)``, and the round's event is ``DistributedDiscreteGaussianEvent(share_sigma(sigma,
parties), sensitivity, min_parties, dimension, grid)``, admitted before any party is contacted
(``dpsynth.methods.wasp.federated_event``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .errors import PrivacyConfigError
from .lattice import lattice_points
from .mechanisms import check_positive, discrete_gaussian_noise
from .noise import NoiseSource

#: Smallest per-party lattice std the KLS bound is used with here.
MIN_SHARE_SIGMA = 1.0


def share_sigma(sigma: float, parties: int) -> float:
    """Per-party std sigma / sqrt(P): P shares add up to variance sigma^2."""
    if isinstance(parties, bool) or not isinstance(parties, int) or parties < 1:
        raise PrivacyConfigError(f"parties must be an integer >= 1, got {parties!r}")
    return check_positive("sigma", sigma) / math.sqrt(parties)


def party_share(local: np.ndarray, grid: float, sigma_party: float,
                noise: NoiseSource) -> np.ndarray:
    """One party's submission: its exact lattice statistic ``local`` (on ``grid * Z^d``) as
    integer steps plus its discrete Gaussian share of std ``sigma_party`` (int64)."""
    g = check_positive("grid", grid)
    s = check_positive("sigma_party", sigma_party)
    if s / g < MIN_SHARE_SIGMA:
        raise PrivacyConfigError(f"a party's noise share must be >= {MIN_SHARE_SIGMA:g} grid "
                                 f"steps, got {s / g:g}")
    v = np.asarray(local, dtype=np.float64)
    spacing = np.full(v.shape, g)
    n = lattice_points(v, spacing, exact=True, name="party statistic")
    return n + discrete_gaussian_noise(v.shape, s, spacing, noise)


def sum_shares(shares: Iterable[np.ndarray], grid: float) -> np.ndarray:
    """The secure sum's result in value units: grid * sum of the parties' integer vectors."""
    g = check_positive("grid", grid)
    total: np.ndarray | None = None
    for share in shares:
        arr = np.asarray(share)
        if not np.issubdtype(arr.dtype, np.integer):
            raise PrivacyConfigError("party shares must be integer lattice steps")
        total = arr.astype(np.int64) if total is None else total + arr
    if total is None:
        raise PrivacyConfigError("no party share to sum")
    return total.astype(np.float64) * g


__all__ = ["MIN_SHARE_SIGMA", "party_share", "share_sigma", "sum_shares"]


# -- SecAgg+'s public quantisation: the grid the shares lie on (from public inputs only) --

DEFAULT_NOISE_BOUND_SDS = 10.0
DEFAULT_QUANTIZATION_RANGE = 2**22
DEFAULT_MODULUS_RANGE = 2**32


@dataclass(frozen=True)
class QuantisationPlan:
    """SecAgg+ quantisation parameters (public; identical for every party): built from the
    config and sigma only (:func:`plan_quantisation`), never from party sizes."""

    clipping_range: float
    quantization_range: int
    modulus_range: int
    vote_bound: float

    @property
    def step(self) -> float:
        """Grid step Delta = 2C / R."""
        return 2.0 * self.clipping_range / self.quantization_range


def _next_pow2(x: float) -> float:
    return float(2.0 ** math.ceil(math.log2(x)))


def plan_quantisation(
    *,
    vote_bound: float,
    sigma: float,
    num_parties: int,
    clipping_range: float | None = None,
    quantization_range: int = DEFAULT_QUANTIZATION_RANGE,
    modulus_range: int = DEFAULT_MODULUS_RANGE,
    noise_bound_sds: float = DEFAULT_NOISE_BOUND_SDS,
    vote_grid: float | None = None,
) -> QuantisationPlan:
    """Pick C = next power of two >= B + k * sigma / sqrt(P) unless given (B = vote_bound).

    ``vote_grid`` (a power of two: WASP's 2^-(Q-1)): the lattice the parties' votes lie on; the
    quantisation range R is raised to a power of two with Delta = 2C / R <= vote_grid, so the
    votes lie exactly on SecAgg+'s grid and each party's discrete Gaussian share is drawn on it.
    Every argument is public (config, calibrated sigma): the plan, and with it the grid of the
    released sum, is the same on neighbouring datasets. Callers pass the declared bound B
    (``wasp.federated.max_records_per_party``), never a party's size."""
    if num_parties < 2:
        raise ValueError(f"num_parties must be >= 2 for secure aggregation, got {num_parties}")
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma!r}")
    if not (math.isfinite(vote_bound) and vote_bound > 0):
        raise ValueError(f"vote_bound must be finite and > 0, got {vote_bound!r}")
    if not isinstance(quantization_range, int) or quantization_range < 2:
        raise ValueError(f"quantization_range must be an int >= 2, got {quantization_range!r}")
    if clipping_range is None:
        clipping_range = _next_pow2(vote_bound + noise_bound_sds * sigma / math.sqrt(num_parties))
    elif not (math.isfinite(clipping_range) and clipping_range > 0):
        raise ValueError(f"clipping_range must be finite and > 0, got {clipping_range!r}")
    if num_parties * quantization_range >= modulus_range:
        raise ValueError(
            f"num_parties * quantization_range ({num_parties} * {quantization_range}) must be "
            f"< modulus_range ({modulus_range}) or the secure sum overflows: lower "
            "wasp.federated.max_records_per_party or the number of parties"
        )
    if vote_grid is not None:
        if not (vote_grid > 0 and math.log2(vote_grid).is_integer()):
            raise ValueError(f"vote_grid must be a power of two, got {vote_grid!r}")
        # as fine as the votes' lattice, as far as the modulus allows (the largest power of
        # two with P * R < modulus): a coarser step drops the vote weights below it
        # (:func:`grid_top_q`), never rounds them
        widest = 2 ** ((modulus_range - 1) // num_parties).bit_length() // 2
        quantization_range = min(widest, max(quantization_range,
                                              int(_next_pow2(2.0 * clipping_range / vote_grid))))
    if num_parties * quantization_range >= modulus_range:
        raise ValueError(
            f"num_parties * quantization_range ({num_parties} * {quantization_range}) must be "
            f"< modulus_range ({modulus_range}) or the secure sum overflows: lower "
            "wasp.federated.max_records_per_party or the number of parties"
        )
    return QuantisationPlan(
        clipping_range=float(clipping_range),
        quantization_range=quantization_range,
        modulus_range=modulus_range,
        vote_bound=float(vote_bound),
    )
