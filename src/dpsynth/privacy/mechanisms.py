"""Pure DP mechanisms: values, parameters and a noise source in, the noisy output out.

Nothing here stores or accounts anything: :class:`dpsynth.privacy.PrivacySession` admits the
release against the budget, calls one of these functions, and commits the result
(docs/methods.md §0). The empirical audit (tests/test_empirical_dp.py) calls these same functions
many times on neighbouring inputs.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from . import dgauss
from .errors import PrivacyConfigError
from .lattice import Lattice, lattice_points, rounded_sensitivity
from .noise import NoiseSource

#: The lattice variance drawn is (sigma / grid)^2 times at least 1 + 2^-44 (and at most about
#: 1 + 2^-29): it covers grids such as 1 / sqrt(k) that are rounded floats.
_VARIANCE_MARGIN = Fraction(2**44 + 1, 2**44)


def as_finite_array(name: str, x: Any, *, allow_neg_inf: bool = False) -> np.ndarray:
    """``x`` as a float64 array; PrivacyConfigError naming ``name`` on NaN / +inf (and -inf)."""
    a = np.asarray(x, dtype=np.float64)
    bad = np.isnan(a) | np.isposinf(a)
    if not allow_neg_inf:
        bad |= np.isneginf(a)
    if bad.any():
        raise PrivacyConfigError(f"{name} contains non-finite entries")
    return a


def check_positive(name: str, value: Any) -> float:
    """``value`` as a float; PrivacyConfigError unless it is a finite number > 0."""
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        raise PrivacyConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def gumbel_argmax(noise: NoiseSource, log_weights: np.ndarray) -> int:
    """argmax(log_weights + Gumbel): index i with probability proportional to exp(log_weights[i]);
    -inf entries are never chosen."""
    lw = np.asarray(log_weights, dtype=np.float64)
    g = np.asarray(noise.gumbel(lw.shape), dtype=np.float64)
    return int(np.argmax(np.where(np.isneginf(lw), -np.inf, lw + g)))


def gaussian_mechanism(value: Any, sigma: float, noise: NoiseSource) -> np.ndarray:
    """value + N(0, sigma^2 I) in floating point: the CONTINUOUS reference (tests and the
    federated parties' shares); every release of the session is
    :func:`discrete_gaussian_mechanism`."""
    check_positive("sigma", sigma)
    v = as_finite_array("value", value)
    return (v + np.asarray(noise.normal(v.shape, sigma), dtype=np.float64)).reshape(v.shape)


def lattice_variance(sigma: float, grid: float) -> Fraction:
    """The exact lattice variance asked of the sampler: (sigma / grid)^2 (1 + 2^-44)."""
    return (Fraction(sigma) / Fraction(grid)) ** 2 * _VARIANCE_MARGIN


def discrete_gaussian_noise(shape: tuple[int, ...], sigma: float, spacing: np.ndarray,
                            noise: NoiseSource) -> np.ndarray:
    """Lattice steps Z (int64, ``shape``): Z_j ~ N_Z(0, s_j^2) with s_j^2 >=
    (sigma / spacing_j)^2, exact (:mod:`dpsynth.privacy.dgauss`), drawn from ``noise``'s
    uniform integers: coordinates of equal spacing together, in index order."""
    flat = np.asarray(spacing, dtype=np.float64).ravel()
    z = np.zeros(flat.size, dtype=np.int64)
    for g in np.unique(flat).tolist():
        where = np.flatnonzero(flat == g)
        try:
            z[where] = dgauss.sample(noise, lattice_variance(sigma, g), where.size)
        except ValueError as err:
            raise PrivacyConfigError(f"noise sigma {sigma:g} on grid {g:g}: {err}") from None
    return z.reshape(shape)


def discrete_gaussian_mechanism(value: Any, sigma: float, lattice: Lattice,
                                noise: NoiseSource) -> np.ndarray:
    """grid * (n + Z) with value = grid * n on the public ``lattice`` (rounded to it when it is
    not exact) and Z exact discrete Gaussian steps of std sigma / grid (docs/methods.md §0).
    The caller bounds the L2 sensitivity on the lattice (:func:`charged_parameters`). Every
    output lies on the lattice, so neighbouring inputs share the same set of outputs."""
    check_positive("sigma", sigma)
    v = as_finite_array("value", value)
    spacing = lattice.spacing(v.shape)
    n = lattice_points(v, spacing, lattice.exact)
    z = discrete_gaussian_noise(v.shape, sigma, spacing, noise)
    return ((n + z).astype(np.float64) * spacing).reshape(v.shape)


def charged_parameters(lattice: Lattice, sensitivity: float, sigma: float, size: int
                       ) -> tuple[float, float]:
    """(sensitivity, sigma) the release is drawn and charged with: unchanged on an exact
    lattice; on a rounded one the sensitivity grows to Delta + grid sqrt(d) and sigma by the
    same factor, so the noise multiplier (and the charge) stays sigma / Delta."""
    delta = check_positive("sensitivity", sensitivity)
    sig = check_positive("sigma", sigma)
    if lattice.exact:
        if lattice.shifts and lattice.profile_norm() > delta * (1.0 + 1e-9):
            raise PrivacyConfigError(
                f"the lattice's shift profile {lattice.shifts} exceeds the sensitivity {delta:g}")
        return delta, sig
    grid = float(np.max(np.asarray(lattice.grid, dtype=np.float64)))
    wider = rounded_sensitivity(delta, grid, size)
    return wider, sig * (wider / delta)


def check_utilities(utilities: Any) -> np.ndarray:
    """Utilities of the exponential mechanism (finite or -inf = excluded, at least one finite)."""
    u = as_finite_array("utilities", utilities, allow_neg_inf=True).ravel()
    if u.size == 0 or np.isneginf(u).all():
        raise PrivacyConfigError("utilities must contain at least one finite entry")
    return u


def exponential_mechanism(
    utilities: Any, sensitivity: float, epsilon: float, noise: NoiseSource
) -> int:
    """Exponential mechanism (McSherry & Talwar 2007): index i with probability proportional to
    exp(eps u_i / (2 Delta_u)), by Gumbel-max; eps-DP. -inf utilities are excluded candidates
    (their exclusion must not depend on private data)."""
    check_positive("sensitivity", sensitivity)
    check_positive("epsilon", epsilon)
    u = check_utilities(utilities)
    return gumbel_argmax(noise, epsilon * u / (2.0 * sensitivity))


def threshold_log_weights(
    values: np.ndarray, target: int, candidates: np.ndarray, epsilon: float, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Log-weights of the threshold exponential mechanism and its grid (utility
    -|#{v > theta} - target|, sensitivity 1; docs/methods.md §4). Returns (log_weights, points):
    in "grid" mode the points are the candidates; in "interval" mode they are the interval end
    points (len(points) = len(log_weights) + 1)."""
    v = as_finite_array("values", values).ravel()
    cand = as_finite_array("candidates", candidates).ravel()
    if cand.size == 0:
        raise PrivacyConfigError("candidates must not be empty")
    if mode == "grid":
        counts = (v[None, :] > cand[:, None]).sum(axis=1)
        return count_log_weights(counts, target, epsilon), cand
    if mode == "interval":
        lo, hi = float(cand.min()), float(cand.max())
        s = np.sort(np.clip(v, lo, hi))
        points = np.concatenate([[lo], s, [hi]])
        lengths = np.diff(points)
        # theta in [points[j], points[j+1]) has exactly n - j values above it (ties: length 0).
        counts = v.size - np.arange(lengths.size)
        util = -np.abs(counts - target).astype(np.float64)
        with np.errstate(divide="ignore"):
            logw = np.log(lengths) + epsilon * util / 2.0
        return logw, points
    raise PrivacyConfigError(f"threshold mode must be 'grid' or 'interval', got {mode!r}")


def count_log_weights(counts: np.ndarray, target: int, epsilon: float) -> np.ndarray:
    """Grid log-weights eps u / 2 from the counts #{v > theta_g} at each grid point (utility
    -|count - target|, sensitivity 1): the one formula of the grid threshold mechanism, whether
    the counts come from the values here or are summed from shards (docs/methods.md §4)."""
    util = -np.abs(np.asarray(counts, dtype=np.int64) - int(target)).astype(np.float64)
    return epsilon * util / 2.0


def check_threshold_counts(counts: Any, candidates: Any) -> tuple[np.ndarray, np.ndarray]:
    """(counts as int64, candidates as float64): one non-negative integer count per candidate."""
    cand = as_finite_array("candidates", candidates).ravel()
    raw = np.asarray(counts).ravel()
    if cand.size == 0 or raw.shape != cand.shape:
        raise PrivacyConfigError("counts must hold one entry per threshold candidate")
    if not np.issubdtype(raw.dtype, np.integer) or (raw < 0).any():
        raise PrivacyConfigError("counts must be non-negative integers")
    return raw.astype(np.int64), cand


def threshold_from_counts(
    counts: Any, target: int, candidates: Any, epsilon: float, noise: NoiseSource
) -> float:
    """The grid threshold mechanism given c_g = #{v > theta_g} for each candidate theta_g
    (e.g. summed over shards): theta_g with probability proportional to exp(eps u_g / 2),
    u_g = -|c_g - target|; the same draw as :func:`threshold_mechanism` in "grid" mode on the
    values themselves."""
    check_positive("epsilon", epsilon)
    c, cand = check_threshold_counts(counts, candidates)
    logw = count_log_weights(c, check_threshold_target(target), epsilon)
    return sample_threshold(noise, logw, cand, "grid")


def sample_threshold(noise: NoiseSource, logw: np.ndarray, points: np.ndarray, mode: str) -> float:
    """Draw theta from :func:`threshold_log_weights` output: a grid point, or an interval then a
    uniform point inside it."""
    if mode == "grid":
        return float(points[gumbel_argmax(noise, logw)])
    if np.isneginf(logw).all():  # empty range (min == max): nothing to choose
        return float(points[0])
    j = gumbel_argmax(noise, logw)
    u = float(np.asarray(noise.uniform(1)).ravel()[0])
    return float(points[j] + u * (points[j + 1] - points[j]))


def check_threshold_target(target: Any) -> int:
    """The threshold mechanism's target count (an integer >= 0)."""
    if isinstance(target, bool) or not isinstance(target, int | np.integer) or target < 0:
        raise PrivacyConfigError(f"target must be an integer >= 0, got {target!r}")
    return int(target)


def threshold_mechanism(
    values: Any,
    target: int,
    candidates: Any,
    epsilon: float,
    noise: NoiseSource,
    mode: str = "grid",
) -> float:
    """A threshold theta with about ``target`` values above it: the exponential mechanism with
    utility -|#{v > theta} - target| (sensitivity 1), eps-DP (docs/methods.md §4)."""
    check_positive("epsilon", epsilon)
    logw, points = threshold_log_weights(
        values, check_threshold_target(target), candidates, epsilon, mode
    )
    return sample_threshold(noise, logw, points, mode)


def private_token_rho(clip: float, temperature: float) -> float:
    """zCDP cost of one private token: rho = (1/2) (c / tau)^2 (docs/methods.md §4)."""
    c = check_positive("clip", clip)
    t = check_positive("temperature", temperature)
    return 0.5 * (c / t) ** 2


def check_logit_sum(clipped_logit_sum: Any) -> np.ndarray:
    """The summed clipped logits as a non-empty finite vector."""
    z = as_finite_array("clipped_logit_sum", clipped_logit_sum).ravel()
    if z.size == 0:
        raise PrivacyConfigError("clipped_logit_sum must not be empty")
    return z


def private_token_mechanism(
    clipped_logit_sum: Any, temperature: float, noise: NoiseSource
) -> int:
    """One private token (DP-SynRAG, docs/methods.md §4): y ~ softmax(z / tau) over the FULL
    vocabulary, z = the sum of clipped logit rows (per-coordinate sensitivity c)."""
    t = check_positive("temperature", temperature)
    return gumbel_argmax(noise, check_logit_sum(clipped_logit_sum) / t)


__all__ = [
    "as_finite_array",
    "charged_parameters",
    "check_positive",
    "discrete_gaussian_mechanism",
    "discrete_gaussian_noise",
    "exponential_mechanism",
    "gaussian_mechanism",
    "lattice_variance",
    "gumbel_argmax",
    "private_token_mechanism",
    "private_token_rho",
    "sample_threshold",
    "threshold_from_counts",
    "threshold_log_weights",
    "threshold_mechanism",
]
