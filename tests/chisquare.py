"""Chi-square goodness of fit for the samplers' tests, valid in the tails.

Pearson's statistic is only close to its chi-square law when every cell expects >= 5 draws.
Pooling all small cells into one remainder cell is not enough: at a discrete Gaussian's tails
that cell can expect 0.2 draws, and three draws landing there give p ~ 1e-7 about once in a
thousand runs of a correct sampler (the false alarm of `test_sampler_matches_the_exact_pmf` at
sigma 1 in secure mode). Here small cells are merged with their neighbours until each one
expects >= 5, so the partition depends on the probabilities only, never on the draws.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpsynth.privacy import dgauss

MIN_EXPECTED = 5.0


def cell_groups(expected: np.ndarray, minimum: float = MIN_EXPECTED) -> np.ndarray:
    """A group index per cell: adjacent cells joined left to right until each group's
    ``expected`` reaches ``minimum``; a short remainder at the end joins the last group."""
    groups = np.zeros(len(expected), dtype=np.int64)
    g, acc = 0, 0.0
    for i, e in enumerate(np.asarray(expected, np.float64)):
        groups[i] = g
        acc += e
        if acc >= minimum:
            g, acc = g + 1, 0.0
    if g == 0:
        raise ValueError("too few expected draws for a chi-square test")
    if groups[-1] == g:  # the remainder
        groups[groups == g] = g - 1
    return groups


def grouped(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` summed per group of :func:`cell_groups`."""
    return np.bincount(groups, weights=np.asarray(values, np.float64))


def chi2_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of ``counts`` against cell probabilities ``probs`` (normalised here); cells of
    probability 0 must have no draws."""
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    if np.any(counts[probs == 0] > 0):
        return 0.0
    live = probs > 0
    n = counts.sum()
    exp = probs[live] / probs[live].sum() * n
    groups = cell_groups(exp)
    obs, exp = grouped(counts[live], groups), grouped(exp, groups)
    if obs.size < 2:
        raise ValueError("a chi-square test needs two cells")
    return float(stats.chisquare(obs, exp).pvalue)


def dgauss_chi2_p(samples: np.ndarray, sigma2: float) -> float:
    """p-value of integer ``samples`` against the exact N_Z(0, sigma2) pmf, on cells fixed by
    sigma alone: the integers in +-(6 s + 3), each end cell holding its tail, grouped into 100
    equal-width cells when wider than 200."""
    half = int(6 * math.sqrt(sigma2)) + 3
    support = np.arange(-half, half + 1)
    probs = np.exp(dgauss.log_pmf(sigma2, support))
    tail = max(1.0 - probs.sum(), 0.0) / 2  # symmetric
    probs[0] += tail
    probs[-1] += tail
    counts = np.bincount(np.clip(samples, -half, half) + half, minlength=support.size)
    if support.size > 200:
        edges = np.linspace(0, support.size, 101).astype(int)[:-1]
        counts, probs = np.add.reduceat(counts, edges), np.add.reduceat(probs, edges)
    return chi2_p(counts, probs)
