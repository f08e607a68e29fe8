"""Noise calibration: the smallest sigma whose planned run meets a target (epsilon, delta)."""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import optimize

from .accountant import Accountant
from .errors import PrivacyConfigError
from .events import Event, GaussianEvent

Plan = Callable[[float], list[Event]]


def validate_epsilon_delta(epsilon: float, delta: float) -> None:
    """Raise PrivacyConfigError unless epsilon > 0 (finite) and 0 < delta < 1."""
    if not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
        raise PrivacyConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not isinstance(delta, int | float) or not (0.0 < delta < 1.0):
        raise PrivacyConfigError(f"delta must be in the open interval (0, 1), got {delta!r}")


def plan_epsilon(plan: Plan, sigma: float, delta: float, kind: str = "pld") -> float:
    """epsilon at ``delta`` of the events ``plan(sigma)``."""
    acc = Accountant(kind)
    acc.extend(plan(sigma))
    return acc.epsilon(delta)


def calibrate_gaussian_sigma(
    epsilon: float,
    delta: float,
    plan: Plan,
    kind: str = "pld",
    tol: float = 1e-4,
    *,
    sigma_max: float = 1e7,
) -> float:
    """Smallest sigma (up to ``tol``, rounded towards more noise) such that the run
    ``plan(sigma)`` is (epsilon, delta)-DP under accountant ``kind``.

    epsilon is non-increasing in sigma: bracket by doubling, then Brent's method. The returned
    sigma always satisfies the target and is within ``tol`` of the smallest one that does.
    """
    validate_epsilon_delta(epsilon, delta)
    if not (tol > 0):
        raise PrivacyConfigError(f"tol must be > 0, got {tol!r}")

    def eps_at(s: float) -> float:
        return plan_epsilon(plan, s, delta, kind)

    if kind == "pld":
        # RDP is looser than the PLD for the same run (pld reports the min of both), so the
        # cheap RDP calibration gives an upper end; a few PLD evaluations then suffice.
        hi = calibrate_gaussian_sigma(epsilon, delta, plan, "rdp", tol, sigma_max=sigma_max)
        lo = 0.8 * hi
        if eps_at(lo) > epsilon:
            return _refine(eps_at, epsilon, lo, hi, tol)
    hi = 1.0
    while eps_at(hi) > epsilon:
        hi *= 2.0
        if hi > sigma_max:
            raise PrivacyConfigError(
                f"no sigma <= {sigma_max:g} reaches epsilon={epsilon} at delta={delta}: the plan "
                "has a part that does not depend on sigma and already exceeds the target"
            )
    lo = hi / 2.0
    while eps_at(lo) <= epsilon:
        if lo < 1e-6:
            return lo
        hi, lo = lo, lo / 2.0
    return _refine(eps_at, epsilon, lo, hi, tol)


def _refine(
    eps_at: Callable[[float], float], epsilon: float, lo: float, hi: float, tol: float
) -> float:
    """Given eps_at(lo) > epsilon >= eps_at(hi): Brent's method on eps(sigma) - epsilon (few
    accountant calls), then the nearest sigma above the root that meets the target."""
    root = optimize.brentq(lambda s: eps_at(s) - epsilon, lo, hi, xtol=tol / 4.0)
    sigma = min(hi, root + tol / 2.0)
    while eps_at(sigma) > epsilon:
        sigma = min(hi, sigma + tol)
    return sigma


def calibrate_steps(
    epsilon: float,
    delta: float,
    steps: int,
    sensitivity: float = 1.0,
    kind: str = "pld",
    tol: float = 1e-4,
) -> float:
    """sigma for ``steps`` Gaussian releases of L2 sensitivity ``sensitivity`` (e.g. T Aug-PE
    iterations) meeting (epsilon, delta); METHODS.md section 0: eps=1, delta=1e-5, T=10 -> 11.80."""
    validate_epsilon_delta(epsilon, delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PrivacyConfigError(f"steps must be an integer >= 1, got {steps!r}")
    if (
        not isinstance(sensitivity, int | float)
        or not math.isfinite(sensitivity)
        or sensitivity <= 0
    ):
        raise PrivacyConfigError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    return calibrate_gaussian_sigma(
        epsilon, delta, lambda s: [GaussianEvent(s, sensitivity, steps)], kind=kind, tol=tol
    )


def steps_epsilon(
    sigma: float, delta: float, steps: int, sensitivity: float = 1.0, kind: str = "pld"
) -> float:
    """epsilon at ``delta`` of ``steps`` Gaussian releases with noise ``sigma``."""
    if not isinstance(delta, int | float) or not (0.0 < delta < 1.0):
        raise PrivacyConfigError(f"delta must be in the open interval (0, 1), got {delta!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PrivacyConfigError(f"steps must be an integer >= 1, got {steps!r}")
    acc = Accountant(kind)
    acc.add(GaussianEvent(sigma, sensitivity, steps))
    return acc.epsilon(delta)
