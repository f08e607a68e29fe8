"""Public lattices the discrete Gaussian releases live on (docs/methods.md §0).

A Gaussian release of dpsynth adds exact discrete Gaussian noise to a statistic on a public
lattice ``grid * Z^d`` and maps the result back: out = grid * (n + Z), n = value / grid. The set
of outputs any two neighbouring inputs can produce is therefore the same lattice, whatever the
floating-point details (no gap as in Mironov 2012).

- Exact lattices: the statistic already lies on the lattice because every record's
  contribution does: counts (grid 1), Aug-PE votes (grid 1 / sqrt(min(k, candidates of the
  label)) per candidate), WASP's votes (2^-(Q-1)), sums of rows truncated toward zero onto the
  public fixed-point grid :data:`FIXED_POINT_GRID` = 2^-32 (SecPE's and DP-SynRAG's embedding
  sums, the user-level vote and count vectors). The sensitivity is unchanged.
- Rounded lattices: a real statistic that is not a sum of lattice contributions (SecPE's
  normalised centres) is rounded to the nearest lattice point first. Rounding moves each
  coordinate by at most grid / 2, so two neighbours' rounded values differ by at most
  Delta + grid sqrt(d) in L2 (:func:`rounded_sensitivity`): that is the sensitivity charged.

``shifts`` (optional) is the exact worst case of one record's change in lattice steps, e.g.
(1,) for a count: every neighbouring pair's shift is, up to order and signs, a sub-vector of
it. The 'pld' accountant then uses dp_accounting's discrete Gaussian PLD; without it the
release is accounted by its zCDP bound rho = Delta^2 / (2 sigma^2), which holds for any
shift of L2 norm <= Delta (Canonne, Kamath & Steinke 2020, Theorem 14).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import PrivacyConfigError

#: Bits of the public fixed-point grid of real-valued releases (2^-32), the grid of the exact
#: embedding sums of dpsynth.compute.kernels (FIXED_POINT_BITS there).
FIXED_POINT_BITS = 32
FIXED_POINT_GRID = 2.0**-FIXED_POINT_BITS
#: The largest |value / grid| an exact lattice accepts: below 2^53 every sum of non-negative
#: lattice values (and one int64 -> float64 conversion) is exact in float64.
_EXACT_MAX = 2.0**53
#: Grids that are not powers of two (1 / sqrt(k)) are recovered by rounding value / grid, which
#: is exact while |n| stays below this bound.
_RECOVER_MAX = 2.0**44


@dataclass(frozen=True)
class Lattice:
    """A public lattice ``grid * Z^d`` (``grid`` a scalar or one spacing per coordinate).

    ``exact``: the caller guarantees that the value lies on it (checked); otherwise it is
    rounded to the nearest point and charged :func:`rounded_sensitivity`. ``shifts``: the
    worst-case change of one record in lattice steps, when it is known exactly (see the module
    docstring)."""

    grid: Any = 1.0
    exact: bool = True
    shifts: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        g = np.asarray(self.grid, dtype=np.float64)
        if g.size == 0 or not np.all(np.isfinite(g)) or np.any(g <= 0):
            raise PrivacyConfigError("lattice grid must hold finite spacings > 0")
        if any(isinstance(s, bool) or int(s) != s or s < 1 for s in self.shifts):
            raise PrivacyConfigError(f"lattice shifts must be integers >= 1, got {self.shifts}")
        object.__setattr__(self, "shifts", tuple(int(s) for s in self.shifts))
        if self.shifts and g.size != 1:
            raise PrivacyConfigError("lattice shifts need one grid spacing for all coordinates")
        if self.shifts and not self.exact:
            raise PrivacyConfigError("a rounded lattice has no exact shift profile")

    @classmethod
    def counts(cls, per_record: int = 1) -> Lattice:
        """Integer counts; one record adds 1 to at most ``per_record`` distinct cells."""
        return cls(1.0, True, (1,) * per_record)

    @classmethod
    def fixed_point(cls) -> Lattice:
        """Sums of rows truncated toward zero onto the public 2^-32 grid."""
        return cls(FIXED_POINT_GRID, True)

    @classmethod
    def rounded(cls, sigma: float) -> Lattice:
        """A real statistic rounded onto the fixed-point grid, coarsened by powers of two
        where sigma / grid would pass the sampler's range (a public function of sigma)."""
        from .dgauss import MAX_SIGMA

        g = FIXED_POINT_GRID
        while sigma / g > MAX_SIGMA / 2:
            g *= 2.0
        return cls(g, False)

    def spacing(self, shape: tuple[int, ...]) -> np.ndarray:
        """The grid spacing of every coordinate of a value of ``shape`` (float64)."""
        g = np.asarray(self.grid, dtype=np.float64)
        try:
            return np.broadcast_to(g, shape).astype(np.float64)
        except ValueError:
            raise PrivacyConfigError(
                f"lattice grid of shape {g.shape} does not match the value's shape {shape}"
            ) from None

    def profile_norm(self) -> float:
        """L2 norm of the shift profile in value units (0 without a profile)."""
        return float(np.asarray(self.grid, np.float64).ravel()[0]) * math.sqrt(
            sum(s * s for s in self.shifts)) if self.shifts else 0.0


def truncate_to_grid(x: Any) -> Any:
    """Values truncated toward zero onto the fixed-point grid 2^-32 (never grows a norm): a
    user's bounded contribution, made an exact lattice value before it is summed."""
    scale = 2.0**FIXED_POINT_BITS
    if isinstance(x, float | int):
        return math.trunc(x * scale) / scale
    return np.trunc(np.asarray(x, dtype=np.float64) * scale) / scale


def count_lattice(user_level: bool) -> Lattice:
    """The lattice of a count vector with L2 sensitivity 1: integers, one record adding 1 to
    one cell (shifts (1,)); at user level each user's vector (scaled to norm <= 1) is
    truncated onto the fixed-point grid, with no exact shift profile."""
    return Lattice.fixed_point() if user_level else Lattice.counts()


def rounded_sensitivity(sensitivity: float, grid: float, dim: int) -> float:
    """L2 sensitivity after rounding to the nearest point of ``grid * Z^dim``:
    ||r(v) - r(v')|| <= ||v - v'|| + ||e - e'|| <= Delta + grid sqrt(dim) (|e_j| <= grid / 2)."""
    return float(sensitivity) + float(grid) * math.sqrt(max(int(dim), 0))


def lattice_points(value: np.ndarray, spacing: np.ndarray, exact: bool, name: str = "value"
                   ) -> np.ndarray:
    """n with value = spacing * n (int64). ``exact``: the value must lie on the lattice
    (PrivacyConfigError naming ``name`` otherwise); else it is rounded to the nearest point."""
    v = np.asarray(value, dtype=np.float64)
    ratio = v / spacing
    n = np.rint(ratio)
    if np.any(np.abs(n) >= _EXACT_MAX):
        raise PrivacyConfigError(f"{name} is too large for its grid (|value / grid| >= 2^53)")
    if exact:
        power_of_two = np.frexp(spacing)[0] == 0.5
        err = np.abs(ratio - n)
        bad = np.where(power_of_two, err != 0, (err > 1e-3) | (np.abs(n) >= _RECOVER_MAX))
        if np.any(bad):
            raise PrivacyConfigError(
                f"{name} does not lie on its public grid: the release expects an exact "
                "lattice statistic (counts, or sums of values truncated onto the grid)")
    return n.astype(np.int64)


def rounding_tv_bound(sigma: float, grid: float, dim: int) -> float:
    """Total variation distance between one rounded-lattice release r(v) + grid Z, Z ~
    N_Z(0, s^2)^dim with s = sigma / grid, and the continuous release v + N(0, sigma^2 I)
    rounded to the lattice (docs/methods.md §3): d tau(s) + grid sqrt(d) / (2 sigma sqrt(2 pi)),
    tau(s) = 0.0202 / s^2 + 0.0511 / s^3 + 1.01 exp(-2 pi^2 s^2) bounding the distance between
    N_Z(0, s^2) and the rounded N(0, s^2) in one coordinate (valid for s >= 1; 1 below)."""
    s = float(sigma) / float(grid)
    if s < 1.0:
        return 1.0
    tau = 0.0202 / s**2 + 0.0511 / s**3 + 1.01 * math.exp(-2.0 * math.pi**2 * s * s)
    return dim * tau + grid * math.sqrt(dim) / (2.0 * sigma * math.sqrt(2.0 * math.pi))


__all__ = [
    "FIXED_POINT_BITS",
    "FIXED_POINT_GRID",
    "Lattice",
    "count_lattice",
    "lattice_points",
    "rounded_sensitivity",
    "rounding_tv_bound",
    "truncate_to_grid",
]
