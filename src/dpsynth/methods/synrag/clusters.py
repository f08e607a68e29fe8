"""Steps 1-2 of DP-SynRAG: the noisy keyword histogram and the soft clustering.

h = sum_d 1[keywords(d)] has L2 sensitivity sqrt(K) (a document adds at most K distinct ones);
h~ = h + N(0, sigma_h^2 I) is rho_hist-zCDP with rho_hist = K / (2 sigma_h^2). Everything after
(top-R, the visiting order) reads only h~: post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def histogram_sigma(k: int, rho_hist: float) -> float:
    """sigma_h with K / (2 sigma_h^2) = rho_hist."""
    return math.sqrt(k / (2.0 * rho_hist))


def keyword_counts(keywords: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    """h: how many documents have each vocabulary term among their keywords."""
    flat = np.fromiter((j for ids in keywords for j in ids), dtype=np.int64)
    return np.bincount(flat, minlength=vocab_size).astype(np.float64)


def noise_floor(sigma_h: float, vocab_size: int) -> float:
    """sigma_h sqrt(2 ln |V|): about the largest of |V| pure-noise coordinates."""
    return sigma_h * math.sqrt(2.0 * math.log(max(vocab_size, 2)))


def top_keywords(noisy: np.ndarray, r: int, min_count: float) -> np.ndarray:
    """Indices of the top-r noisy counts that are >= min_count, most frequent first
    (a function of the released h~ only)."""
    order = np.argsort(-noisy, kind="stable")
    order = order[noisy[order] >= min_count]
    return order[:r]


@dataclass(frozen=True)
class SoftClusters:
    """C_r for each seed keyword (in the order of ``seeds``, most frequent first)."""

    seeds: np.ndarray
    members: list[np.ndarray]

    def memberships(self, n_docs: int) -> np.ndarray:
        """How many clusters each document joined (<= L)."""
        m = np.zeros(n_docs, dtype=np.int64)
        for mem in self.members:
            m[mem] += 1
        return m


def soft_clusters(
    keywords: Sequence[Sequence[int]], seeds: np.ndarray, overlap: int
) -> SoftClusters:
    """docs/methods.md §4 step 2: visit the seeds from least to most frequent; keyword w_r
    forms C_r = documents that contain w_r and are in fewer than L clusters so far."""
    by_kw: dict[int, list[int]] = {}
    wanted = {int(s) for s in seeds}
    for i, ids in enumerate(keywords):
        for j in ids:
            if j in wanted:
                by_kw.setdefault(int(j), []).append(i)
    used = np.zeros(len(keywords), dtype=np.int64)
    members: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(seeds)
    for pos in range(len(seeds) - 1, -1, -1):  # least frequent first
        docs = np.asarray(by_kw.get(int(seeds[pos]), []), dtype=np.int64)
        docs = docs[used[docs] < overlap] if docs.size else docs
        used[docs] += 1
        members[pos] = docs
    return SoftClusters(np.asarray(seeds, dtype=np.int64), members)
