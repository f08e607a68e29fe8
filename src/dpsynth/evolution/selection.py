"""Selection from noisy histograms: pure post-processing of released statistics."""

from __future__ import annotations

import numpy as np


def allocate(total: int, noisy_counts: np.ndarray) -> np.ndarray:
    """Split `total` samples across labels in proportion to noisy counts (negatives -> 0),
    by largest remainder so the parts add up to `total` exactly (docs/methods.md §1, step 1).

    If every noisy count is <= 0 the split is uniform.
    """
    weights = np.maximum(np.asarray(noisy_counts, dtype=np.float64), 0.0)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    exact = total * weights / weights.sum()
    parts = np.floor(exact).astype(np.int64)
    remainder = total - int(parts.sum())
    if remainder > 0:
        order = np.argsort(-(exact - parts), kind="stable")
        parts[order[:remainder]] += 1
    return parts


def shrunk_counts(noisy_counts: np.ndarray, noise_var: float) -> np.ndarray:
    """Noisy label counts shrunk toward their mean by the positive-part James-Stein rule
    (Efron and Morris 1973, eq. 1.5): c_y' = m + max(0, 1 - (L - 3) v / S) (c_y - m), with m
    the mean of the L noisy counts, S = sum_y (c_y - m)^2 and v the variance of each count's
    noise (public: the release's sigma squared, times the cells summed into a count). Where
    the noise is as large as the spread of the counts (a small epsilon, many labels) the split
    moves toward uniform instead of following the noise; where it is small, the counts stand.
    Post-processing of released values (no budget). Fewer than 4 labels: unchanged."""
    c = np.asarray(noisy_counts, dtype=np.float64)
    if c.size < 4 or noise_var <= 0:
        return c
    m = float(c.mean())
    spread = float(np.sum((c - m) ** 2))
    factor = max(0.0, 1.0 - (c.size - 3) * noise_var / spread) if spread > 0 else 0.0
    return m + factor * (c - m)


def split_weights(noisy_counts: np.ndarray, noise_var: float, split: str) -> np.ndarray:
    """The weights a release is split over labels by (``synthesis.label_split``): the counts
    shrunk by their noise (:func:`shrunk_counts`; "noisy_counts") or one each ("uniform")."""
    if split == "uniform":
        return np.ones(np.asarray(noisy_counts).shape, dtype=np.float64)
    if split != "noisy_counts":
        raise ValueError(f"unknown label split {split!r} (use 'noisy_counts' or 'uniform')")
    return shrunk_counts(noisy_counts, noise_var)


def thresholded(noisy_hist: np.ndarray, theta: float) -> np.ndarray:
    """H~ <- max(H~ - theta, 0) (docs/methods.md §1, step 3c)."""
    return np.maximum(np.asarray(noisy_hist, dtype=np.float64) - theta, 0.0)


def select_per_label(scores: np.ndarray, labels: np.ndarray, quota: np.ndarray, mode: str,
                     rng: np.random.Generator) -> np.ndarray:
    """Indices of kept candidates: per label y, the top quota[y] by score ("rank") or
    quota[y] draws with replacement proportional to score ("sample"; uniform when all are 0).
    """
    kept: list[np.ndarray] = []
    for label, n_keep in enumerate(quota):
        idx = np.flatnonzero(labels == label)
        if n_keep <= 0 or len(idx) == 0:
            continue
        s = scores[idx]
        if mode == "rank":
            order = np.lexsort((idx, -s))  # ties broken by index, deterministically
            kept.append(idx[order[: min(n_keep, len(idx))]])
        elif mode == "sample":
            p = s / s.sum() if s.sum() > 0 else np.full(len(idx), 1.0 / len(idx))
            kept.append(rng.choice(idx, size=int(n_keep), replace=True, p=p))
        else:
            raise ValueError(f"unknown selection mode {mode!r} (use 'rank' or 'sample')")
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)


def top_indices(scores: np.ndarray, labels: np.ndarray, per_label: int) -> dict[int, np.ndarray]:
    """For each label present, the indices of its `per_label` highest-scoring candidates."""
    out: dict[int, np.ndarray] = {}
    for label in np.unique(labels):
        idx = np.flatnonzero(labels == label)
        order = np.lexsort((idx, -scores[idx]))
        out[int(label)] = idx[order[:per_label]]
    return out
