"""Fidelity: how close the synthetic distribution is to the real one (docs/methods.md §5).

All metrics take precomputed embedding arrays ``[n, d]`` (rows are samples) so that they are
independent of the embedder; texts only enter the length and label distributions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .common import MetricUnavailable

#: Below this many samples per side FID refuses (a covariance needs at least two points).
FID_MIN_SAMPLES = 2
#: MAUVE quantises both sets into clusters; fewer points than this gives no usable histogram.
MAUVE_MIN_SAMPLES = 20


def _as_2d(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array [n, d], got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise MetricUnavailable(f"{name} holds NaN or infinite values")
    return arr


def gaussian_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of the rows of ``x``."""
    arr = np.asarray(x, dtype=np.float64)
    return arr.mean(axis=0), np.atleast_2d(np.cov(arr, rowvar=False))


def frechet_distance(
    mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray, eps: float = 1e-6
) -> float:
    """Fréchet distance between N(mu1, sigma1) and N(mu2, sigma2) (Heusel et al. 2017, eq. 6).

    d^2 = ||mu1 - mu2||^2 + Tr(sigma1 + sigma2 - 2 (sigma1 sigma2)^{1/2}).
    The matrix square root comes from scipy; a non-finite result (near-singular product) is
    retried with ``eps`` added to both diagonals, and a small imaginary part left by round-off
    is dropped (a large one is an error).
    """
    from scipy import linalg

    mu1, mu2 = np.atleast_1d(mu1).astype(np.float64), np.atleast_1d(mu2).astype(np.float64)
    sigma1 = np.atleast_2d(sigma1).astype(np.float64)
    sigma2 = np.atleast_2d(sigma2).astype(np.float64)
    if mu1.shape != mu2.shape or sigma1.shape != sigma2.shape:
        raise ValueError(
            f"frechet_distance: shapes differ (mu {mu1.shape} vs {mu2.shape}, "
            f"sigma {sigma1.shape} vs {sigma2.shape})"
        )
    diff = mu1 - mu2
    covmean = linalg.sqrtm(sigma1 @ sigma2)
    if not np.all(np.isfinite(covmean)):
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = linalg.sqrtm((sigma1 + offset) @ (sigma2 + offset))
    if np.iscomplexobj(covmean):
        imag = np.max(np.abs(covmean.imag)) if covmean.size else 0.0
        scale = max(1.0, float(np.max(np.abs(covmean.real))) if covmean.size else 1.0)
        if imag > 1e-3 * scale:
            raise MetricUnavailable(
                f"matrix square root has a large imaginary component ({imag:.3g}); "
                "the covariance estimates are too degenerate for FID"
            )
        covmean = covmean.real
    value = float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * np.trace(covmean))
    return max(value, 0.0)


def fid(x: np.ndarray, y: np.ndarray, min_samples: int = FID_MIN_SAMPLES) -> float:
    """FID between two embedding sets: Fréchet distance of the Gaussians fitted to each.

    Raises :class:`MetricUnavailable` with fewer than ``min_samples`` rows on either side.
    """
    x, y = _as_2d(x, "first set"), _as_2d(y, "second set")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"fid: embedding dimensions differ ({x.shape[1]} vs {y.shape[1]})")
    smallest = min(len(x), len(y))
    if smallest < max(min_samples, 2):
        raise MetricUnavailable(
            f"FID needs at least {max(min_samples, 2)} samples per set, got {len(x)} and {len(y)}"
        )
    return frechet_distance(*gaussian_stats(x), *gaussian_stats(y))


def _sq_dists(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    aa = np.einsum("ij,ij->i", a, a)[:, None]
    bb = np.einsum("ij,ij->i", b, b)[None, :]
    return np.maximum(aa + bb - 2.0 * (a @ b.T), 0.0)


def _knn_radii(x: np.ndarray, k: int, chunk: int) -> np.ndarray:
    """Squared distance from each row of x to its k-th nearest other row of x."""
    radii = np.empty(len(x))
    for start in range(0, len(x), chunk):
        d = _sq_dists(x[start : start + chunk], x)
        # column 0 of the sorted row is the point itself (distance 0)
        radii[start : start + chunk] = np.partition(d, k, axis=1)[:, k]
    return radii


def _coverage(points: np.ndarray, centres: np.ndarray, radii: np.ndarray, chunk: int) -> float:
    """Share of ``points`` inside at least one ball (centre, radius)."""
    inside = np.zeros(len(points), dtype=bool)
    for start in range(0, len(points), chunk):
        d = _sq_dists(points[start : start + chunk], centres)
        inside[start : start + chunk] = (d <= radii[None, :]).any(axis=1)
    return float(inside.mean())


def knn_precision_recall(
    real: np.ndarray, synthetic: np.ndarray, k: int = 3, chunk: int = 1024
) -> dict[str, float]:
    """Improved precision and recall (Kynkäänniemi et al. 2019, eqs. 1-3).

    Each set's manifold is the union of balls around its points with radius the distance to the
    point's k-th nearest neighbour in the same set. Precision = share of synthetic points inside
    the real manifold; recall = share of real points inside the synthetic manifold.
    """
    real, synthetic = _as_2d(real, "real set"), _as_2d(synthetic, "synthetic set")
    if k < 1:
        raise ValueError(f"knn_precision_recall: k must be >= 1, got {k}")
    if min(len(real), len(synthetic)) <= k:
        raise MetricUnavailable(
            f"kNN precision/recall with k={k} needs more than {k} samples per set, "
            f"got {len(real)} real and {len(synthetic)} synthetic"
        )
    real_radii = _knn_radii(real, k, chunk)
    syn_radii = _knn_radii(synthetic, k, chunk)
    return {
        "precision": _coverage(synthetic, real, real_radii, chunk),
        "recall": _coverage(real, synthetic, syn_radii, chunk),
        "k": k,
    }


def mauve_score(
    p: np.ndarray,
    q: np.ndarray,
    num_buckets: int | None = None,
    seed: int = 25,
    min_samples: int = MAUVE_MIN_SAMPLES,
) -> float:
    """MAUVE (Pillutla et al. 2021) between two sets of precomputed features via ``mauve-text``.

    ``num_buckets`` defaults to max(2, min(n_p, n_q) // 10) (the package's heuristic, kept small
    for small sets). Both sets are quantised by k-means after PCA; the score is the area under
    the divergence frontier (eq. 3), in (0, 1], higher = closer.
    """
    p, q = _as_2d(p, "first set"), _as_2d(q, "second set")
    smallest = min(len(p), len(q))
    if smallest < min_samples:
        raise MetricUnavailable(
            f"MAUVE needs at least {min_samples} samples per set, got {len(p)} and {len(q)}"
        )
    import mauve

    buckets = num_buckets if num_buckets is not None else max(2, smallest // 10)
    out = mauve.compute_mauve(
        p_features=p.astype(np.float32),
        q_features=q.astype(np.float32),
        num_buckets=int(buckets),
        kmeans_num_redo=2,
        kmeans_max_iter=200,
        seed=seed,
        verbose=False,
    )
    return float(out.mauve)


# -- distributions of text length and labels ------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def word_lengths(texts: Sequence[str]) -> np.ndarray:
    return np.array([len(_WORD.findall(t)) for t in texts], dtype=np.int64)


def total_variation(p: dict[str, float], q: dict[str, float]) -> float:
    """Total-variation distance 0.5 * sum_x |p(x) - q(x)| over the union of supports."""
    keys = set(p) | set(q)
    return 0.5 * float(sum(abs(p.get(key, 0.0) - q.get(key, 0.0)) for key in keys))


def label_distribution(values: Sequence[Any]) -> dict[str, float]:
    """Share of each label value (keys as strings, sorted)."""
    if not values:
        return {}
    counts = Counter(str(v) for v in values)
    total = sum(counts.values())
    return {key: counts[key] / total for key in sorted(counts)}


def _summary(lengths: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(lengths.mean()),
        "median": float(np.median(lengths)),
        "std": float(lengths.std()),
        "p10": float(np.percentile(lengths, 10)),
        "p90": float(np.percentile(lengths, 90)),
    }


def length_comparison(
    synthetic: Sequence[str], real: Sequence[str], bins: int = 20
) -> dict[str, Any]:
    """Word-count distributions of both sets: summaries, histograms on shared bins, TV and KS."""
    from scipy.stats import ks_2samp

    if not synthetic or not real:
        raise MetricUnavailable(
            f"length distribution needs texts on both sides, got {len(synthetic)} synthetic "
            f"and {len(real)} real"
        )
    a, b = word_lengths(synthetic), word_lengths(real)
    hi = int(max(a.max(), b.max(), 1))
    edges = np.linspace(0, hi + 1, bins + 1)
    ha = np.histogram(a, bins=edges)[0] / len(a)
    hb = np.histogram(b, bins=edges)[0] / len(b)
    return {
        "synthetic": _summary(a),
        "real": _summary(b),
        "bin_edges": edges.tolist(),
        "synthetic_hist": ha.tolist(),
        "real_hist": hb.tolist(),
        "tv": 0.5 * float(np.abs(ha - hb).sum()),
        "ks": float(ks_2samp(a, b).statistic),
    }


def label_comparison(synthetic: Sequence[Any], real: Sequence[Any]) -> dict[str, Any]:
    """Label shares of both sets and their total-variation distance."""
    if not synthetic or not real:
        raise MetricUnavailable(
            f"label distribution needs labels on both sides, got {len(synthetic)} synthetic "
            f"and {len(real)} real"
        )
    ps, pr = label_distribution(synthetic), label_distribution(real)
    return {"synthetic": ps, "real": pr, "tv": total_variation(ps, pr)}
