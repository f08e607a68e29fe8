"""SecPE secret clustering and representative voting (SecPE paper s.3.3-3.4; docs/methods.md §3).

* ``public_centres``: KMeans on public embeddings -> centres e_k and sizes n_k (no privacy cost:
  public records hold no secret).
* ``accumulate_private``: clip each private embedding to norm R, Poisson-sample record i with
  probability rho_i, assign it to its nearest centre, and accumulate per-centre sums and counts
  m_k. Streams the private embeddings chunk by chunk: O(K d) memory, independent of M.
* ``release_representatives``: the one release of the statistics (Eq. in s.3.3)
  e~_k = (n_k e_k + sum_{i in C_k} e^_i) / (n_k + m_k) + Delta_k N(0, sigma^2 I) and
  n~_k = n_k + m_k + N(0, sigma^2), through the privacy session (stored, accounted, never
  redrawn), with the noise plan ``RepresentativeNoise`` (Delta_k = (R + max(1, R)) / n_k for
  unit public embeddings; derivation in its docstring). SecPE and the tests use this function.
* ``representative_vote``: each representative gives n~_k to its nearest candidate: O(K N).
* ``nearest_count_vote``: the per-record baseline, O(M N): each private record adds 1 to its
  k nearest candidates (weight 1, not Aug-PE's 1/sqrt(k); no labels, no noise).

Nearest candidates use faiss inner product on unit-norm candidate embeddings, which for unit
candidates ranks exactly like L2 distance for any query (||q - c||^2 = ||q||^2 + 1 - 2 <q, c>),
so non-unit noisy centres are handled correctly. Nearest *centres* (not unit) use L2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import faiss
import numpy as np
import scipy.sparse as sp

from dpsynth.knn import nearest
from dpsynth.privacy.noise import NoiseSource

#: Joint sensitivity of one sampled record on the pair (e~, n~), in units of the noise:
#: it moves the centre mean of its cluster by <= Delta_k (noise Delta_k sigma; see
#: RepresentativeNoise) AND the count by 1 (noise sigma), so the L2 norm of the normalised
#: shift is sqrt(2), not 1. The dominating
#: pair N(sum Bern(rho_i), sigma^2) of the paper has unit sensitivity; to release both statistics
#: safely, use sigma = JOINT_SENSITIVITY * (sigma calibrated by calibrate_secret_sigma).
#: (The paper's Theorem 1 is stated for the released pair; we could not check its proof, so we
#: take the conservative reading.)
JOINT_SENSITIVITY = float(np.sqrt(2.0))


def _f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32)


def public_centres(
    public_emb: np.ndarray, k: int, seed: int = 0, niter: int = 20
) -> tuple[np.ndarray, np.ndarray]:
    """KMeans (faiss) on the public embeddings: (centres [k, d], sizes n_k [k]).

    Empty clusters are dropped (the noise scale Delta_k divides by n_k), so fewer than k centres
    may come back.
    """
    x = _f32(public_emb)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError("public_emb must be a non-empty [n, d] array")
    if k < 1:
        raise ValueError(f"clusters k must be >= 1, got {k}")
    k = min(k, x.shape[0])
    km = faiss.Kmeans(x.shape[1], k, niter=niter, seed=seed, verbose=False,
                      max_points_per_centroid=max(256, x.shape[0] // k + 1))
    km.train(x)
    centres = np.asarray(km.centroids, dtype=np.float32)
    _, lab = km.index.search(x, 1)
    sizes = np.bincount(lab[:, 0], minlength=k).astype(np.int64)
    keep = sizes > 0
    return centres[keep], sizes[keep]


def clip_rows(x: np.ndarray, clip_R: float) -> np.ndarray:
    """Scale each row to L2 norm <= clip_R (Clip_R in the paper)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip_R / np.maximum(norms, 1e-12))
    return (x * scale).astype(np.float32, copy=False)


@dataclass
class PrivateAccumulation:
    """Per-centre sums of clipped sampled private embeddings and their counts m_k (private!)."""

    sums: np.ndarray  # [K, d] float64
    counts: np.ndarray  # [K] int64
    n_seen: int  # private records streamed
    n_sampled: int  # records that survived Poisson sampling


def assign_private(centres: np.ndarray, private_emb_iter: Iterable[np.ndarray],
                   clip_R: float) -> np.ndarray:
    """Nearest public centre (L2) of every clipped private embedding: int32 labels [M].

    Private embeddings and public centres are fixed across iterations, so this can be computed
    once and passed to ``accumulate_private(labels=...)``; it is an internal intermediate (never
    released), so caching it changes nothing in the released statistics. Memory: 4 bytes/record.
    """
    c = _f32(centres)
    parts = []
    for chunk in private_emb_iter:
        if len(chunk):
            _, lab = nearest(clip_rows(_f32(chunk), clip_R), c, k=1, metric="l2")
            parts.append(lab[:, 0].astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def _clip_factors(x: np.ndarray, clip_R: float) -> np.ndarray:
    """min(1, R / ||x_i||) per row: the factor that clips row i to norm ``clip_R`` (float32
    for a Python float R, float64 for a NumPy one, as NumPy's promotion gives)."""
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    return np.minimum(1.0, clip_R / np.maximum(norms, 1e-12))


def _clip_and_assign(rows: np.ndarray, c: np.ndarray, clip_R: float,
                     labels: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, their clip factors, each one's centre). With cached ``labels`` (and float32
    factors) the rows are returned as they are and the clip is applied as they are summed
    (:func:`_add_to_centres`: the same float32 products, bit for bit, without a clipped copy);
    otherwise the rows are clipped (an owned copy, factors 1), and without ``labels`` each
    one's nearest centre of ``c`` found."""
    factors = _clip_factors(rows, clip_R)
    if labels is not None and factors.dtype == np.float32:
        return rows, factors, labels.astype(np.int64)
    x = np.array(rows, dtype=np.float32)  # owned copy of the sampled rows
    x *= factors[:, None]
    lab = labels.astype(np.int64) if labels is not None else nearest(x, c, k=1,
                                                                      metric="l2")[1][:, 0]
    return x, np.ones(len(x), dtype=np.float32), lab


def _add_to_centres(sums: np.ndarray, counts: np.ndarray, x: np.ndarray, scale: np.ndarray,
                    lab: np.ndarray) -> None:
    """Add ``scale[i] * x[i]`` to its centre's sum, and 1 to its count (in place).

    The per-centre sums are one sparse product: the [K x m] one-hot holding each row's clip
    factor, built column-major (row i is column i, one entry: no sort, no copy of ``x``; a
    factor of 1.0 multiplies exactly) times ``x``. SciPy's column-major product streams the
    rows of ``x`` once, in order, into the [K x d] sums; each centre's terms are added in row
    order, so a centre's sum depends on its own rows only. 0.18 s per 1M x 384 rows against
    0.40-0.43 s for the row-major product split over two threads (benchmarks/results/voting.md)."""
    k = counts.shape[0]
    m = lab.size
    counts += np.bincount(lab, minlength=k)
    onehot = sp.csc_matrix((scale, lab, np.arange(m + 1)), shape=(k, m))
    sums += onehot @ x


def accumulate_private(
    centres: np.ndarray,
    private_emb_iter: Iterable[np.ndarray],
    rates: np.ndarray,
    clip_R: float,
    noise: NoiseSource,
    labels: np.ndarray | None = None,
) -> PrivateAccumulation:
    """Clip, Poisson-sample (prob rates[i]) and assign the streamed private embeddings.

    ``rates`` (and ``labels`` from ``assign_private``, if given) are aligned with the
    concatenation of the chunks. Only sampled rows are clipped and assigned, so the cost is O(M)
    for the coin flips plus O(m K d) for the m sampled rows (O(m d) with cached labels).
    The coin flips come from ``noise.uniform`` (they are part of the mechanism's randomness).
    """
    c = _f32(centres)
    if c.ndim != 2:
        raise ValueError("centres must be [K, d]")
    if clip_R <= 0:
        raise ValueError(f"clip_R must be > 0, got {clip_R}")
    rates = np.asarray(rates, dtype=np.float64)
    if np.any(rates < 0) or np.any(rates > 1):
        raise ValueError("sampling rates must lie in [0, 1]")
    k, d = c.shape
    sums = np.zeros((k, d), dtype=np.float64)
    counts = np.zeros(k, dtype=np.int64)
    offset = 0
    sampled = 0
    for chunk in private_emb_iter:
        n = chunk.shape[0]
        if n == 0:
            continue
        if chunk.ndim != 2 or chunk.shape[1] != d:
            raise ValueError(
                f"private chunk at row {offset} has shape {chunk.shape}, need [*, {d}]"
            )
        if offset + n > rates.size:
            raise ValueError(f"rates has {rates.size} entries but the stream has more rows")
        take = np.asarray(noise.uniform(n)) < rates[offset : offset + n]
        if labels is not None and labels.shape[0] < offset + n:
            raise ValueError(f"labels has {labels.shape[0]} entries but the stream has more rows")
        chunk_labels = None if labels is None else labels[offset : offset + n][take]
        offset += n
        if not take.any():
            continue
        rows = chunk if take.all() else chunk[take]  # gather only when rows were dropped
        x, scale, lab = _clip_and_assign(_f32(rows), c, clip_R, chunk_labels)
        _add_to_centres(sums, counts, x, scale, lab)
        sampled += int(take.sum())
    if offset != rates.size:
        raise ValueError(f"stream had {offset} private rows but rates has {rates.size} entries")
    return PrivateAccumulation(sums=sums, counts=counts, n_seen=offset, n_sampled=sampled)


@dataclass(frozen=True)
class RepresentativeNoise:
    """The noise plan of one representatives release (docs/methods.md §3).

    ``sigma`` is the std of every released coordinate in units of its sensitivity; SecPE uses
    JOINT_SENSITIVITY times the sigma calibrated for a unit shift. ``public_norm`` bounds the
    norm of every public embedding (1 for the unit embeddings of the embedder).

    Centre sensitivity, for any clip radius R. Centre k is released as
    e~_k = (n_k e_k + S_k) / (n_k + m_k), where n_k e_k is the sum of the n_k public embeddings
    of cluster k (each of norm <= B = public_norm) and S_k the sum of the m_k sampled private
    rows assigned to k (each clipped to norm <= R). Centres and assignments are fixed before any
    private row is read, so adding one sampled row x changes one centre only:

        e~'_k - e~_k = (n_k e_k + S_k + x) / (n_k + m_k + 1) - e~_k
                     = (x - e~_k) / (n_k + m_k + 1).

    e~_k is a convex combination of vectors of norm <= B and <= R, so ||e~_k|| <= max(B, R), and
    ||x|| <= R; hence ||e~'_k - e~_k|| <= (R + max(B, R)) / (n_k + m_k + 1) < (R + max(B, R)) / n_k.
    Removing a row is the same step read backwards. So the centre sensitivity is
    Delta_k = (R + max(B, R)) / n_k: 2R / n_k when R >= B (the paper's scale), but (1 + R) / n_k
    for unit embeddings and R < 1 (2R / n_k would understate it, e.g. 5.5x at R = 0.1).
    The count n~_k = n_k + m_k moves by 1. Released in units of Delta_k (centres) and 1 (counts),
    one sampled row shifts the whole vector by at most sqrt(1 + 1) = JOINT_SENSITIVITY.
    """

    clip_R: float
    sigma: float
    public_norm: float = 1.0

    def __post_init__(self) -> None:
        if not (np.isfinite(self.clip_R) and self.clip_R > 0):
            raise ValueError(f"clip_R must be > 0, got {self.clip_R}")
        if not (np.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if not (np.isfinite(self.public_norm) and self.public_norm > 0):
            raise ValueError(f"public_norm must be > 0, got {self.public_norm}")

    def centre_sensitivity(self, sizes: np.ndarray) -> np.ndarray:
        """Delta_k = (R + max(B, R)) / n_k per centre (see the class docstring)."""
        return (self.clip_R + max(self.public_norm, self.clip_R)) / np.asarray(sizes, np.float64)

    def centre_noise_std(self, sizes: np.ndarray) -> np.ndarray:
        """Noise std of each coordinate of centre k: Delta_k * sigma."""
        return self.centre_sensitivity(sizes) * self.sigma


@dataclass
class RepresentativeGroup:
    """One block of a release (SecPE: one label): public centres, sizes n_k and the private
    accumulation on them."""

    centres: np.ndarray  # [K, d]
    sizes: np.ndarray  # [K], n_k >= 1
    acc: PrivateAccumulation


@dataclass
class NoisyRepresentatives:
    """Released representatives (safe to publish) and the noise scales used."""

    e_tilde: np.ndarray  # [K, d]
    n_tilde: np.ndarray  # [K]
    centre_noise_std: np.ndarray  # [K]: Delta_k * sigma
    count_noise_std: float  # sigma


class GaussianReleaser(Protocol):
    """What release_representatives needs of a privacy session (PrivacySession.gaussian)."""

    def gaussian(self, key: str, value: np.ndarray, sensitivity: float, sigma: float, *,
                 name: str = ..., sampling_rate: float = ...) -> np.ndarray: ...


def _check_group(g: RepresentativeGroup, plan: RepresentativeNoise) -> tuple[int, int]:
    centres = np.asarray(g.centres, dtype=np.float64)
    if centres.ndim != 2:
        raise ValueError("centres must be [K, d]")
    k, d = centres.shape
    if (np.shape(g.sizes) != (k,) or g.acc.sums.shape != (k, d)
            or g.acc.counts.shape != (k,)):
        raise ValueError("sums [K,d], counts [K], centres [K,d] and sizes [K] must agree")
    if np.any(np.asarray(g.sizes) < 1):
        raise ValueError("every public centre needs n_k >= 1 (the centre sensitivity divides "
                         "by n_k)")
    # Centres are means of public embeddings: a centre longer than public_norm proves that a
    # public embedding is longer too, and the sensitivity bound would not hold.
    if np.any(np.linalg.norm(centres, axis=1) > plan.public_norm * (1 + 1e-6)):
        raise ValueError(
            f"a public centre has norm above public_norm={plan.public_norm}: the centre "
            "sensitivity (R + max(B, R)) / n_k needs every public embedding of norm <= B; pass "
            "the largest public embedding norm as public_norm"
        )
    return k, d


def release_representatives(
    session: GaussianReleaser,
    key: str,
    groups: list[RepresentativeGroup],
    plan: RepresentativeNoise,
    *,
    sampling_rate: float = 1.0,
    name: str = "representatives",
) -> list[NoisyRepresentatives]:
    """The one SecPE release: e~_k and n~_k of every group, noised once through ``session``.

    Every centre coordinate is divided by its sensitivity Delta_k and every count by 1, so a
    single Gaussian release of L2 sensitivity JOINT_SENSITIVITY with std ``plan.sigma`` covers
    the whole vector (stored, accounted and resumable by the session under ``key``); the noisy
    centres are scaled back, so centre k carries noise Delta_k * sigma per coordinate and each
    count sigma. With ``plan.sigma == 0`` (no protection asked) nothing is released through the
    session and the statistics come back exact.
    """
    shapes = [_check_group(g, plan) for g in groups]
    blocks = []
    for g in groups:
        sizes = np.asarray(g.sizes, dtype=np.float64)
        counts = np.asarray(g.acc.counts, dtype=np.float64)
        mean = (sizes[:, None] * np.asarray(g.centres, np.float64) + g.acc.sums) / (
            sizes + counts)[:, None]
        blocks.append((mean / plan.centre_sensitivity(sizes)[:, None]).ravel())
        blocks.append(sizes + counts)
    value = np.concatenate(blocks) if blocks else np.zeros(0)
    if plan.sigma > 0:
        noisy = np.asarray(session.gaussian(key, value, JOINT_SENSITIVITY, plan.sigma, name=name,
                                            sampling_rate=sampling_rate), dtype=np.float64)
    else:
        noisy = value
    out, offset = [], 0
    for g, (k, d) in zip(groups, shapes, strict=True):
        sizes = np.asarray(g.sizes, dtype=np.float64)
        sens = plan.centre_sensitivity(sizes)
        e_tilde = noisy[offset: offset + k * d].reshape(k, d) * sens[:, None]
        offset += k * d
        n_tilde = noisy[offset: offset + k]
        offset += k
        out.append(NoisyRepresentatives(e_tilde=e_tilde.astype(np.float32), n_tilde=n_tilde,
                                        centre_noise_std=sens * plan.sigma,
                                        count_noise_std=float(plan.sigma)))
    return out


def nearest_candidate(queries: np.ndarray, candidate_emb: np.ndarray,
                      batch: int = 16384) -> np.ndarray:
    """Index of the nearest (unit-norm) candidate for every query, batched."""
    _, ids = nearest(queries, candidate_emb, k=1, metric="ip", batch=batch)
    return ids[:, 0]


def representative_vote(e_tilde: np.ndarray, n_tilde: np.ndarray,
                        candidate_emb: np.ndarray) -> np.ndarray:
    """Histogram [N]: representative k adds n~_k to its nearest candidate (O(K N))."""
    nn = nearest_candidate(e_tilde, candidate_emb)
    return np.bincount(nn, weights=np.asarray(n_tilde, dtype=np.float64),
                       minlength=len(candidate_emb))


def nearest_count_vote(private_emb_iter: Iterable[np.ndarray], candidate_emb: np.ndarray,
                       k: int = 1, batch: int = 8192) -> np.ndarray:
    """True histogram [N] (no noise): how many private records have each candidate among
    their k nearest. Each record adds weight 1 to each of its k neighbours (Aug-PE's vote,
    :func:`dpsynth.voting.knn_vote`, gives 1/sqrt(k) per label; for k = 1 without
    labels the two agree). The O(M N) baseline that ``representative_vote`` is measured
    against; streams the private chunks, memory O(batch N) at most inside faiss."""
    hist = np.zeros(len(candidate_emb), dtype=np.float64)
    for chunk in private_emb_iter:
        if len(chunk):
            _, ids = nearest(chunk, candidate_emb, k=k, metric="ip", batch=batch)
            hist += np.bincount(ids.ravel(), minlength=len(candidate_emb))
    return hist
