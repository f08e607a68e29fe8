"""Noise sources: a secure one for real releases (the default) and a seeded one for research.

Secure noise (``privacy.noise: secure``) comes from the OS CSPRNG and cannot be recomputed.
Seeded noise is an explicit research mode: whoever learns the seed can recompute every draw, so
the seed is drawn at random when the config gives none and kept only in the run's private/
folder (:func:`run_seed`), and the ledger refuses a (dataset, seed) pair twice (docs/methods.md
§0). The same private seed drives post-processing randomness so a resumed run makes the same
choices.

Every Gaussian release is discrete (docs/methods.md §0): the session draws exact discrete
Gaussian noise on a public lattice (:mod:`dpsynth.privacy.dgauss`, Canonne-Kamath-Steinke 2020)
from a source's :meth:`NoiseSource.integers`, exact uniform integers (the OS CSPRNG, or numpy's
PCG64 in seeded mode), so the set of possible outputs around f(D) and f(D') is the same
lattice (no floating-point gap, Mironov 2012). ``normal`` (continuous, floating point) remains
for the federated parties' shares until they move to the distributed discrete Gaussian
(:mod:`dpsynth.privacy.distributed`); ``uniform``, ``gumbel`` and ``choice`` drive the
exponential mechanism, Poisson coins and other mechanism randomness.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
from scipy.special import ndtri

from ..files import atomic_write_text
from .errors import PrivacyConfigError

Size = int | tuple[int, ...]

_TWO_POW_53 = float(2**53)


@runtime_checkable
class NoiseSource(Protocol):
    """Where every random draw of a DP mechanism comes from."""

    mode: str

    def normal(self, size: Size, scale: float = 1.0) -> np.ndarray:
        """Gaussian N(0, scale^2) draws of the given shape."""
        ...

    def uniform(self, size: Size) -> np.ndarray:
        """Uniform draws in [0, 1)."""
        ...

    def gumbel(self, size: Size) -> np.ndarray:
        """Standard Gumbel draws (location 0, scale 1)."""
        ...

    def choice(self, probs: np.ndarray) -> int:
        """Index i drawn with probability probs[i] / sum(probs)."""
        ...

    def integers(self, high: np.ndarray) -> np.ndarray:
        """Exact uniform integers: entry i uniform in [0, high[i]) (int64, 1 <= high < 2^63);
        what the discrete Gaussian sampler is fed with."""
        ...


def _check_scale(scale: float) -> None:
    if not np.isfinite(scale) or scale < 0:
        raise ValueError(f"noise scale must be finite and >= 0, got {scale!r}")


def _check_high(high: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``high`` as int64 (not copied when it is already), with its least and largest entry
    (0, 0 when empty)."""
    h = np.asarray(high)
    if not np.issubdtype(h.dtype, np.integer):
        raise ValueError("integers: high must hold integers >= 1")
    lo, top = (int(h.min()), int(h.max())) if h.size else (0, 0)
    if h.size and lo < 1:
        raise ValueError("integers: high must hold integers >= 1")
    return h.astype(np.int64, copy=False), lo, top


def _inverse_cdf_choice(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF sampling of a categorical distribution from one uniform u in [0, 1)."""
    p = np.asarray(probs, dtype=np.float64).ravel()
    if p.size == 0 or np.any(~np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise ValueError("choice: probs must be finite, >= 0 and not all zero")
    cdf = np.cumsum(p)
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    # Guard against round-off at the top end and skip zero-probability tail entries.
    idx = min(idx, p.size - 1)
    while p[idx] == 0 and idx > 0:
        idx -= 1
    return idx


class SeededNoise:
    """Reproducible noise from numpy's PCG64 generator; for experiments and tests only."""

    mode = "seeded"

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self._seq = np.random.SeedSequence(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seq))

    def spawn(self, key: str) -> SeededNoise:
        """An independent stream determined by (seed, key): a resumed run draws the same noise
        for the same key and never reuses another key's noise."""
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
        child = SeededNoise.__new__(SeededNoise)
        child.seed = self.seed
        child._seq = np.random.SeedSequence([*self._seq.generate_state(4), *words])
        child._rng = np.random.Generator(np.random.PCG64(child._seq))
        return child

    def normal(self, size: Size, scale: float = 1.0) -> np.ndarray:
        _check_scale(scale)
        return self._rng.normal(0.0, 1.0, size) * scale

    def uniform(self, size: Size) -> np.ndarray:
        return self._rng.random(size)

    def gumbel(self, size: Size) -> np.ndarray:
        return self._rng.gumbel(0.0, 1.0, size)

    def choice(self, probs: np.ndarray) -> int:
        return _inverse_cdf_choice(probs, float(self._rng.random()))

    def integers(self, high: np.ndarray) -> np.ndarray:
        """numpy's unbiased bounded integers (Lemire's method with rejection). One bound for
        every entry takes numpy's scalar-bound path: the same draws from the same stream
        (tests/test_noise.py), about 4x faster than the per-entry path."""
        h, lo, top = _check_high(high)
        if h.size and lo == top:
            return self._rng.integers(0, top, size=h.shape, dtype=np.int64)
        return self._rng.integers(0, h, dtype=np.int64)


class SecureNoise:
    """Unpredictable noise from the OS entropy pool (os.urandom); cannot be seeded.

    Integers are exact (rejection from 64-bit words); uniforms carry 53 random bits; continuous
    Gaussians (federated shares only) are ndtri(U) of open-interval uniforms (k + 1/2) / 2^53,
    Gumbels are -log(-log U).
    """

    mode = "secure"

    def spawn(self, key: str) -> SecureNoise:
        """Secure noise has no state to derive: every draw is fresh OS entropy."""
        return self

    @staticmethod
    def _bits53(n: int) -> np.ndarray:
        raw = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        return raw >> np.uint64(11)

    def _open_uniform(self, size: Size) -> np.ndarray:
        n = int(np.prod(size)) if not isinstance(size, int) else size
        u = (self._bits53(n).astype(np.float64) + 0.5) / _TWO_POW_53
        return u.reshape(size)

    def normal(self, size: Size, scale: float = 1.0) -> np.ndarray:
        _check_scale(scale)
        return ndtri(self._open_uniform(size)) * scale

    def uniform(self, size: Size) -> np.ndarray:
        n = int(np.prod(size)) if not isinstance(size, int) else size
        return (self._bits53(n).astype(np.float64) / _TWO_POW_53).reshape(size)

    def gumbel(self, size: Size) -> np.ndarray:
        return -np.log(-np.log(self._open_uniform(size)))

    def choice(self, probs: np.ndarray) -> int:
        return _inverse_cdf_choice(probs, float(self.uniform(1)[0]))

    def integers(self, high: np.ndarray) -> np.ndarray:
        """Uniform in [0, high) from OS words (8 to 64 bits, the fewest that hold high - 1),
        by rejection: with one bound for all entries the top bits of a word are kept if below
        it; otherwise a word below 2^w mod high is redrawn and the others taken mod high (each
        residue then has the same number of words)."""
        h, lo, top = _check_high(high)
        flat = h.ravel()
        if flat.size == 0:
            return np.zeros(h.shape, dtype=np.int64)
        if top == lo:
            return self._same_bound(top, flat.size).reshape(h.shape)
        width = 32 if top <= 2**32 else 64
        hu = flat.astype(np.uint64)
        out = np.empty(flat.shape, dtype=np.uint64)
        todo = np.arange(flat.size)
        while todo.size:
            words = _os_words(todo.size, width).astype(np.uint64)
            hi = hu[todo]
            # 2^w mod high (for w = 64 in wrapping uint64 arithmetic)
            low = (np.uint64(0) - hi) % hi if width == 64 else np.uint64(2**32) % hi
            ok = words >= low
            out[todo[ok]] = words[ok] % hi[ok]
            todo = todo[~ok]
        return out.reshape(h.shape).astype(np.int64)

    @staticmethod
    def _same_bound(high: int, n: int) -> np.ndarray:
        """n uniform integers in [0, high): the top bits of OS words, redrawn when >= high."""
        bits = max((high - 1).bit_length(), 1)
        width = next(w for w in (8, 16, 32, 64) if bits <= w)
        out = np.empty(n, dtype=np.int64)
        filled = 0
        while filled < n:
            need = n - filled
            v = _os_words(need + need // 2 + 8, width).astype(np.uint64) >> np.uint64(width - bits)
            v = v[v < np.uint64(high)][:need]
            out[filled:filled + v.size] = v.astype(np.int64)
            filled += v.size
        return out


def _os_words(n: int, width: int) -> np.ndarray:
    """n unsigned words of ``width`` bits from os.urandom."""
    dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[width]
    return np.frombuffer(os.urandom(n * width // 8), dtype=dtype)


def make_noise_source(mode: str = "secure", seed: int | None = None) -> NoiseSource:
    """Build a noise source: "secure" (OS entropy, no seed; the default) or "seeded" (numpy
    PCG64(seed); research mode, a None seed draws fresh entropy)."""
    if mode == "seeded":
        return SeededNoise(seed)
    if mode == "secure":
        return SecureNoise()
    raise PrivacyConfigError(f"noise mode must be 'seeded' or 'secure', got {mode!r}")


SEED_FILE = "seed"


def run_seed(private_dir: Path | str, configured: int | None = None) -> int:
    """The run's seed, kept in ``private_dir/seed`` (mode 0600) and reused on resume.

    First call: the configured seed, or 128 random bits from the OS when none is configured.
    Later calls return the stored seed; a configured seed that differs from it is an error.
    """
    path = Path(private_dir) / SEED_FILE
    if path.is_file():
        text = path.read_text(encoding="ascii").strip()
        try:
            stored = int(text)
        except ValueError:
            raise PrivacyConfigError(f"{path}: not an integer seed") from None
        if configured is not None and int(configured) != stored:
            raise PrivacyConfigError(
                f"privacy.seed differs from the seed this run started with ({path}); "
                "a resumed run must keep its seed"
            )
        return stored
    seed = int(configured) if configured is not None else int.from_bytes(os.urandom(16), "big")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_text(path, f"{seed}\n", mode=0o600)
    return seed
