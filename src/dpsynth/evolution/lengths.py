"""How long the records are, as the generators need to know it: a DP estimate from one noisy
histogram over (label class x length bin), released in place of the label counts.

A record adds 1 to one cell of the joint histogram (its label class, the bin of its word
count), so the release has L2 sensitivity 1, the same as the label counts alone: one Gaussian
release buys the label counts (row sums), the length distribution (column sums) and a noisy
record count (the total), all post-processing (docs/methods.md §1, "Sizes from the data").
At user level each user's cell counts are scaled to norm 1 (:func:`user_label_counts`), as
for the label counts. The bins are fixed and public (:data:`LENGTH_EDGES`): nothing about
them is read from the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..compute.kernels import (
    LENGTH_EDGES,
    N_BINS,
    finish,
    label_length_partial,
    length_bin,
    sum_partials,
)

__all__ = ["LENGTH_EDGES", "N_BINS", "Sizes", "exact_label_lengths", "length_bin", "tokens_for"]

#: the word count the open last bin stands for
LONGEST = 400
#: the share of the records' (noisy) length mass a generation may cover: the generators write
#: up to the length of the 90th percentile's bin, and a text shorter than the lower edge of the
#: 10th percentile's bin is outside the band (refused and regenerated)
COVER = 0.9
#: tokens a word takes on average in the default models' tokenizers (SmolLM2, Gemma 3:
#: 1.3-1.4 on English reviews and questions), with headroom
TOKENS_PER_WORD = 1.5


def exact_label_lengths(compute: object, n_labels: int) -> np.ndarray:
    """The exact joint histogram, [n_labels, N_BINS] (private: the releaser noises it)."""
    parts = compute.map(label_length_partial, n_labels)  # type: ignore[attr-defined]
    return finish(sum_partials(parts), n_labels * N_BINS, 1.0).reshape(n_labels, N_BINS)


@dataclass(frozen=True)
class Sizes:
    """What the released joint histogram says, all post-processing: noisy counts per label
    class, the noisy length distribution over :data:`LENGTH_EDGES`' bins and the noisy
    record count (clipped at 0)."""

    label_counts: np.ndarray
    lengths: np.ndarray
    records: float

    @classmethod
    def of(cls, noisy: np.ndarray) -> Sizes:
        noisy = np.asarray(noisy, dtype=np.float64)
        return cls(noisy.sum(axis=1), noisy.sum(axis=0), max(float(noisy.sum()), 0.0))

    def max_words(self) -> int:
        """The upper edge of the bin holding the :data:`COVER` quantile of the (clipped)
        noisy length distribution; :data:`LONGEST` for the open bin; 64 words when the
        released mass is not positive."""
        mass = np.maximum(self.lengths, 0.0)
        if mass.sum() <= 0:
            return 64
        b = self._quantile_bin(COVER)
        return LENGTH_EDGES[b] if b < len(LENGTH_EDGES) else LONGEST

    def length_mix(self) -> list[float] | None:
        """The share of each length bin up to the :data:`COVER` quantile's, from the (clipped)
        noisy length distribution: what a zero-shot request draws its length from (None when
        the released mass is not positive)."""
        mass = np.maximum(self.lengths, 0.0)
        if mass.sum() <= 0:
            return None
        mass = mass[: self._quantile_bin(COVER) + 1]  # holds at least COVER of the mass
        return (mass / mass.sum()).round(6).tolist()

    def min_words(self) -> int | None:
        """The lower edge of the bin holding the ``1 - COVER`` quantile of the (clipped) noisy
        length distribution: the short end of the length band (None when the released mass
        is not positive, or the quantile falls in the first bin)."""
        if np.maximum(self.lengths, 0.0).sum() <= 0:
            return None
        b = self._quantile_bin(1.0 - COVER)
        return LENGTH_EDGES[b - 1] if b > 0 else None

    def _quantile_bin(self, q: float) -> int:
        mass = np.maximum(self.lengths, 0.0)
        below = np.cumsum(mass) / mass.sum()
        return int(np.searchsorted(below, q))


def exact_max_words(texts: Iterable[str]) -> int:
    """:meth:`Sizes.max_words` of the exact lengths of ``texts`` (private: for the
    operator's plan only, never a release)."""
    hist = np.bincount([length_bin(t) for t in texts], minlength=N_BINS).astype(np.float64)
    return Sizes.of(hist[None, :]).max_words()


def bin_words(b: int) -> int:
    """The longest text of length bin ``b`` in words: one under its (exclusive) upper edge, so
    that a text of that length stays in the bin (:data:`LONGEST` for the open last bin)."""
    return LENGTH_EDGES[b] - 1 if b < len(LENGTH_EDGES) else LONGEST


def drawn_lengths(mix: list[float] | None, n: int, rng: np.random.Generator
                  ) -> list[int | None]:
    """``n`` text lengths in words, each the :func:`bin_words` of a bin drawn from ``mix``
    (post-processing of the released lengths); None each without a mix."""
    if not mix or n == 0:
        return [None] * n
    p = np.asarray(mix, dtype=np.float64)
    return [bin_words(int(b)) for b in rng.choice(len(p), size=n, p=p / p.sum())]


def tokens_for(words: int) -> int:
    """max_new_tokens for texts of up to ``words`` words (:data:`TOKENS_PER_WORD`, plus 8
    for punctuation and an end token), at most 1024."""
    return min(1024, int(math.ceil(words * TOKENS_PER_WORD)) + 8)


def words_within(tokens: int) -> int:
    """The most words :func:`tokens_for` gives ``tokens`` for (its inverse, at least 1): the
    length a text stopped by a cap of ``tokens`` new tokens has reached."""
    return max(1, int((tokens - 8) / TOKENS_PER_WORD))
