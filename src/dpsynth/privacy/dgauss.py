"""Exact discrete Gaussian sampling with integer arithmetic (docs/methods.md §0).

N_Z(0, s^2) is the distribution on the integers with P(x) proportional to exp(-x^2 / (2 s^2))
(Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy", CKS below).
The sampler is CKS's Algorithm 3 on top of their Algorithms 1 and 2, vectorised with numpy
int64 and fed by a source of exact uniform integers (:class:`UniformIntegers`: the OS CSPRNG
by default, the key's seeded stream in research mode, dpsynth.privacy.noise):

- Bernoulli(n / m) is ``uniform integer in [0, m) < n``: no floating point anywhere;
- Bernoulli(exp(-gamma)), gamma rational in [0, 1] (CKS Algorithm 1, von Neumann): K = 1;
  while Bernoulli(gamma / K): K += 1; return K odd. Bernoulli(gamma / K) is drawn as
  Bernoulli(gamma) AND Bernoulli(1 / K), so no product of large integers is formed;
- discrete Laplace with scale t (CKS Algorithm 2): U uniform in [0, t), keep it with probability
  exp(-U / t), V = number of successes of Bernoulli(exp(-1)) before the first failure,
  X = U + t V, a fair sign (rejecting -0);
- discrete Gaussian (CKS Algorithm 3): Y from the discrete Laplace with t = floor(s) + 1, kept
  with probability exp(-(|Y| - s^2 / t)^2 / (2 s^2)). This is exact for any t > 0.

Exact variance. The variance drawn is S = t c / b with b a power of two and c an integer,
S = the smallest such value >= the requested s^2 (:func:`variance_params`): S exceeds s^2 by a
relative 2^-30 at most, never falls below it (more noise: the privacy bound charged for s^2
holds). With e = |Y| b - c the acceptance exponent is gamma = e^2 / (2 t c b) exactly; it is
split into L = r L1 equal parts (r = ceil(|e| / (t b)), L1 = ceil(|e| / (2 c))), each part the
product (|e| / (r t b)) (|e| / (2 c L1)) of two rationals in [0, 1] whose terms stay below
2^62, and Bernoulli(exp(-gamma)) is the AND of the L parts' Bernoulli(exp(-gamma / L)). A
draw whose integers would pass 2^62 (probability below 2^-1000 per coordinate for every
supported s) raises :class:`SamplerOverflow` and returns nothing.

Timing: the sampler never sees the value it noises (the mechanism adds the noise afterwards),
so its running time depends on the noise only, never on the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np

#: Smallest and largest lattice standard deviation the sampler accepts.
MIN_SIGMA = Fraction(1, 16)
MAX_SIGMA = 2**44
#: The drawn variance exceeds the requested one by at most this relative amount.
PRECISION_BITS = 30
_LIMIT = 2**62
#: Largest ratio r = ceil(|e| / (t b)) handled (P(r > 4096) < e^-4000 per draw).
_MAX_R = 4096


class SamplerOverflow(ArithmeticError):
    """A draw would need integers beyond 2^62 (probability below 2^-1000): nothing is drawn."""


@runtime_checkable
class UniformIntegers(Protocol):
    """Exact uniform integers: ``integers(high)[i]`` uniform in [0, high[i]) (int64 array,
    1 <= high < 2^63)."""

    def integers(self, high: np.ndarray) -> np.ndarray:
        ...


@dataclass(frozen=True)
class VarianceParams:
    """The drawn variance t c / b: t the discrete Laplace scale (floor(s) + 1), b = 2^k."""

    t: int
    c: int
    b: int

    @property
    def variance(self) -> Fraction:
        """The exact variance parameter drawn, t c / b."""
        return Fraction(self.t * self.c, self.b)


def as_fraction(x: float | int | Fraction) -> Fraction:
    """``x`` as an exact rational (a float's exact binary value)."""
    if isinstance(x, bool):
        raise TypeError("not a number")
    return x if isinstance(x, Fraction) else Fraction(x)


def variance_params(sigma2: float | int | Fraction) -> VarianceParams:
    """The parameters of N_Z(0, S) with S = t c / b the smallest such value >= ``sigma2``
    (b the smallest power of two with t / b <= sigma2 2^-PRECISION_BITS)."""
    q = as_fraction(sigma2)
    if not (MIN_SIGMA**2 <= q <= Fraction(MAX_SIGMA) ** 2):
        raise ValueError(f"discrete Gaussian sigma^2 = {float(q):g} (in grid steps) is outside "
                         f"[{float(MIN_SIGMA)**2:g}, 2^{2 * int(math.log2(MAX_SIGMA))}]")
    t = math.isqrt(q.numerator // q.denominator) + 1  # floor(sqrt(q)) + 1
    need = Fraction(t * 2**PRECISION_BITS) / q  # b >= need
    b = 1 if need <= 1 else 1 << (math.ceil(need) - 1).bit_length()
    c = math.ceil(q * b / t)
    return VarianceParams(t, c, b)


def _bernoulli(src: UniformIntegers, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(num / den) per entry (0 <= num <= den)."""
    return np.asarray(src.integers(np.asarray(den, np.int64)), np.int64) < num


def _bernoulli_exp(src: UniformIntegers, n: int, gamma: Callable[[np.ndarray], np.ndarray]
                   ) -> np.ndarray:
    """n draws of Bernoulli(exp(-gamma_i)), gamma_i in [0, 1] (CKS Algorithm 1). ``gamma(idx)``
    draws Bernoulli(gamma_i) for the entries ``idx``; the first step (K = 1) needs no
    Bernoulli(1 / K)."""
    k = np.ones(n, dtype=np.int64)
    active = np.flatnonzero(gamma(np.arange(n)))
    k[active] = 2
    while active.size:
        hit = gamma(active) & _bernoulli(src, np.ones(active.size, np.int64), k[active])
        active = active[hit]
        k[active] += 1
    return k % 2 == 1


def _discrete_laplace(src: UniformIntegers, t: int, n: int) -> np.ndarray:
    """n draws of the discrete Laplace P(x) proportional to exp(-|x| / t) (CKS Algorithm 2)."""
    parts: list[np.ndarray] = []
    todo = n
    tt = np.int64(t)
    while todo:
        m = _oversample(todo, 0.55)  # about 1 - e^-1 of the U are kept, 1 - 1/(2t) of the signs
        u = np.asarray(src.integers(np.full(m, t, np.int64)), np.int64)
        keep = _bernoulli_exp(src, m, lambda i, u=u: _bernoulli(src, u[i], np.full(i.size, tt)))
        u = u[keep]
        m = u.size
        v = np.zeros(m, dtype=np.int64)
        active = np.arange(m)
        while active.size:  # Bernoulli(exp(-1)): gamma = 1
            hit = _bernoulli_exp(src, active.size, lambda i: np.ones(i.size, dtype=bool))
            active = active[hit]
            v[active] += 1
        if m and int(v.max()) >= (_LIMIT - t) // t:
            raise SamplerOverflow("discrete Laplace draw beyond 2^62")
        x = u + tt * v
        neg = np.asarray(src.integers(np.full(m, 2, np.int64)), np.int64) == 1
        ok = ~(neg & (x == 0))
        y = np.where(neg, -x, x)[ok][:todo]
        parts.append(y)
        todo -= y.size
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _oversample(todo: int, rate: float) -> int:
    """How many candidates to draw for ``todo`` outputs of a rejection step kept at about
    ``rate``: the kept draws are i.i.d., so the first ``todo`` of them are taken and the rest
    dropped (fewer rounds of small numpy calls, the same distribution)."""
    return int(todo / rate * 1.05) + 32


def _accept(src: UniformIntegers, y: np.ndarray, p: VarianceParams) -> np.ndarray:
    """Bernoulli(exp(-(|y| - S / t)^2 / (2 S))) per entry, exactly (see the module docstring):
    the AND of L = r L1 draws of Bernoulli(exp(-gamma / L)), evaluated part by part and stopped
    at an entry's first failure."""
    t, c, b = p.t, p.c, p.b
    a = np.abs(y)
    if a.size and int(a.max()) >= (_LIMIT - c) // b:
        raise SamplerOverflow("discrete Gaussian acceptance beyond 2^62")
    e = np.abs(a * np.int64(b) - np.int64(c))
    tb = t * b
    r = np.maximum((e + (tb - 1)) // tb, 1)  # |e| <= r t b
    l1 = np.maximum((e + (2 * c - 1)) // (2 * c), 1)  # |e| <= 2 c L1
    if r.size and (int(r.max()) > min(_MAX_R, _LIMIT // tb)
                   or int(l1.max()) > _LIMIT // (2 * c * _MAX_R)):
        raise SamplerOverflow("discrete Gaussian acceptance beyond 2^62")
    parts = r * l1  # gamma / L = (|e| / (r t b)) (|e| / (2 c L1)), both in [0, 1]
    den1 = r * np.int64(tb)
    den2 = l1 * np.int64(2 * c)
    accepted = np.ones(y.size, dtype=bool)
    idx = np.flatnonzero(e > 0)  # e = 0: gamma = 0, always kept
    done = 0
    while idx.size:
        ok = _bernoulli_exp(src, idx.size, lambda i, k=idx: _bernoulli(src, e[k[i]], den1[k[i]])
                            & _bernoulli(src, e[k[i]], den2[k[i]]))
        accepted[idx[~ok]] = False
        done += 1
        idx = idx[ok & (parts[idx] > done)]
    return accepted


def sample(src: UniformIntegers, sigma2: float | int | Fraction, n: int) -> np.ndarray:
    """``n`` independent draws of N_Z(0, S), S = :func:`variance_params` (sigma2).variance
    (>= sigma2), as int64."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    p = variance_params(sigma2)
    out: list[np.ndarray] = []
    todo = int(n)
    while todo:
        y = _discrete_laplace(src, p.t, _oversample(todo, 0.6))
        y = y[_accept(src, y, p)][:todo]
        out.append(y)
        todo -= y.size
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def log_pmf(sigma2: float | int | Fraction, support: np.ndarray) -> np.ndarray:
    """log P(x) of N_Z(0, sigma2) at the integers ``support`` (float64; the normaliser is
    summed over +-(40 s + 40)); the reference the sampler is tested against."""
    s2 = float(as_fraction(sigma2))
    half = int(40 * math.sqrt(s2) + 40)
    xs = np.arange(-half, half + 1, dtype=np.float64)
    log_norm = float(np.logaddexp.reduce(-xs * xs / (2.0 * s2)))
    x = np.asarray(support, dtype=np.float64)
    return -x * x / (2.0 * s2) - log_norm


__all__ = [
    "MAX_SIGMA",
    "MIN_SIGMA",
    "PRECISION_BITS",
    "SamplerOverflow",
    "UniformIntegers",
    "VarianceParams",
    "as_fraction",
    "log_pmf",
    "sample",
    "variance_params",
]
