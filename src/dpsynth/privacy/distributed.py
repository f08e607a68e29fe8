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
