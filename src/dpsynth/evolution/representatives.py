"""SecPE secret clustering and representative voting (SecPE paper s.3.3-3.4; METHODS.md s.3).

* ``public_centres``: KMeans on public embeddings -> centres e_k and sizes n_k (no privacy cost:
  public records hold no secret).
* ``accumulate_private``: clip each private embedding to norm R, Poisson-sample record i with
  probability rho_i, assign it to its nearest centre, and accumulate per-centre sums and counts
  m_k. Streams the private embeddings chunk by chunk: O(K d) memory, independent of M.
* ``add_representative_noise``: the released statistics (Eq. in s.3.3)
  e~_k = (n_k e_k + sum_{i in C_k} e^_i) / (n_k + m_k) + xi_k,  xi_k ~ (2R / n_k) N(0, sigma^2 I),
  n~_k = n_k + m_k + N(0, sigma^2). Each call draws the noise exactly once.
* ``noisy_representatives``: the two above in sequence.
* ``representative_vote``: each representative gives n~_k to its nearest candidate: O(K N).
* ``per_point_vote``: the Aug-PE per-record nearest-neighbour vote, O(M N), as the baseline.

Nearest candidates use faiss inner product on unit-norm candidate embeddings, which for unit
candidates ranks exactly like L2 distance for any query (||q - c||^2 = ||q||^2 + 1 - 2 <q, c>),
so non-unit noisy centres are handled correctly. Nearest *centres* (not unit) use L2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import faiss
import numpy as np
import scipy.sparse as sp

from dpsynth.privacy.noise import NoiseSource, SeededNoise

#: Joint sensitivity of one sampled record on the pair (e~, n~), in units of the noise:
#: it moves the centre mean of its cluster by <= 2R / n_k (noise (2R / n_k) sigma) AND the count
#: by 1 (noise sigma), so the L2 norm of the normalised shift is sqrt(2), not 1. The dominating
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

    Empty clusters are dropped (the noise scale 2R / n_k needs n_k >= 1), so fewer than k centres
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
    index = faiss.IndexFlatL2(c.shape[1])
    index.add(c)
    parts = []
    for chunk in private_emb_iter:
        if len(chunk):
            _, lab = index.search(clip_rows(_f32(chunk), clip_R), 1)
            parts.append(lab[:, 0].astype(np.int32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


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
    index = faiss.IndexFlatL2(d)
    index.add(c)
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
        x = np.array(chunk[take], dtype=np.float32)  # owned copy of the sampled rows
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        x *= np.minimum(1.0, clip_R / np.maximum(norms, 1e-12))[:, None]
        if chunk_labels is None:
            _, lab = index.search(x, 1)
            lab = lab[:, 0]
        else:
            lab = chunk_labels.astype(np.int64)
        counts += np.bincount(lab, minlength=k)
        # Per-centre sums as a sparse one-hot [K x m] times x: no sort, no extra dense copy.
        onehot = sp.csr_matrix(
            (np.ones(lab.size, dtype=np.float32), (lab, np.arange(lab.size))), shape=(k, lab.size)
        )
        sums += onehot @ x
        sampled += int(take.sum())
    if offset != rates.size:
        raise ValueError(f"stream had {offset} private rows but rates has {rates.size} entries")
    return PrivateAccumulation(sums=sums, counts=counts, n_seen=offset, n_sampled=sampled)


@dataclass
class NoisyRepresentatives:
    """Released representatives (safe to publish) and the noise scales used."""

    e_tilde: np.ndarray  # [K, d]
    n_tilde: np.ndarray  # [K]
    centre_noise_std: np.ndarray  # [K]: 2 R sigma / n_k
    count_noise_std: float  # sigma


def add_representative_noise(
    sums: np.ndarray,
    counts: np.ndarray,
    centres: np.ndarray,
    sizes: np.ndarray,
    clip_R: float,
    sigma: float,
    noise: NoiseSource,
) -> NoisyRepresentatives:
    """e~_k = (n_k e_k + S_k) / (n_k + m_k) + (2R/n_k) sigma Z_k and n~_k = n_k + m_k + sigma Z'_k.

    One ``noise.normal`` draw of shape [K, d] (unit scale, then scaled per centre) and one of
    shape [K]; call it once per release (the caller stores the result; re-drawing for the same
    statistic would be a second release).
    """
    centres = np.asarray(centres, dtype=np.float64)
    sizes = np.asarray(sizes, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    sums = np.asarray(sums, dtype=np.float64)
    k, d = centres.shape
    if sums.shape != (k, d) or counts.shape != (k,) or sizes.shape != (k,):
        raise ValueError("sums [K,d], counts [K], centres [K,d] and sizes [K] must agree")
    if np.any(sizes < 1):
        raise ValueError("every public centre needs n_k >= 1 (noise scale 2R/n_k)")
    if sigma < 0 or clip_R <= 0:
        raise ValueError("sigma must be >= 0 and clip_R > 0")
    # The 2R / n_k bound needs every vector averaged into a centre to have norm <= R: public
    # embeddings must have norm <= clip_R (unit embeddings: clip_R >= 1). Centres are means of
    # public embeddings, so a centre with norm > R proves the condition is violated.
    if np.any(np.linalg.norm(centres, axis=1) > clip_R * (1 + 1e-6)):
        raise ValueError(
            f"clip_R={clip_R} is smaller than a public centre's norm; the noise scale 2R/n_k "
            "needs public embeddings of norm <= clip_R (use clip_R >= 1 for unit embeddings)"
        )
    mean = (sizes[:, None] * centres + sums) / (sizes + counts)[:, None]
    std = 2.0 * clip_R * sigma / sizes
    z = np.asarray(noise.normal((k, d), 1.0), dtype=np.float64)
    z_n = np.asarray(noise.normal(k, 1.0), dtype=np.float64)
    return NoisyRepresentatives(
        e_tilde=(mean + std[:, None] * z).astype(np.float32),
        n_tilde=sizes + counts + sigma * z_n,
        centre_noise_std=std,
        count_noise_std=float(sigma),
    )


def noisy_representatives(
    centres: np.ndarray,
    sizes: np.ndarray,
    private_emb_iter: Iterable[np.ndarray],
    rates: np.ndarray,
    clip_R: float,
    sigma: float,
    noise: NoiseSource | None = None,
    labels: np.ndarray | None = None,
    sampler: NoiseSource | None = None,
) -> NoisyRepresentatives:
    """Secret clustering, one release: accumulate the private stream, then add noise once.

    ``sampler`` (default: ``noise``) supplies the Poisson coin flips; ``labels`` optional cached
    centre assignments from ``assign_private``.
    """
    noise = noise if noise is not None else SeededNoise(0)
    acc = accumulate_private(centres, private_emb_iter, rates, clip_R,
                             sampler if sampler is not None else noise, labels=labels)
    return add_representative_noise(acc.sums, acc.counts, centres, sizes, clip_R, sigma, noise)


def nearest_candidate(queries: np.ndarray, candidate_emb: np.ndarray,
                      batch: int = 16384) -> np.ndarray:
    """Index of the nearest (unit-norm) candidate for every query, batched."""
    cand = _f32(candidate_emb)
    index = faiss.IndexFlatIP(cand.shape[1])
    index.add(cand)
    out = np.empty(len(queries), dtype=np.int64)
    for s in range(0, len(queries), batch):
        _, ids = index.search(_f32(queries[s : s + batch]), 1)
        out[s : s + batch] = ids[:, 0]
    return out


def representative_vote(e_tilde: np.ndarray, n_tilde: np.ndarray,
                        candidate_emb: np.ndarray) -> np.ndarray:
    """Histogram [N]: representative k adds n~_k to its nearest candidate (O(K N))."""
    nn = nearest_candidate(e_tilde, candidate_emb)
    return np.bincount(nn, weights=np.asarray(n_tilde, dtype=np.float64),
                       minlength=len(candidate_emb))


def per_point_vote(private_emb_iter: Iterable[np.ndarray], candidate_emb: np.ndarray,
                   k: int = 1, batch: int = 8192) -> np.ndarray:
    """Aug-PE vote (true histogram, no noise): every private record adds 1 to each of its k
    nearest candidates. Streams the private chunks; memory O(batch N) at most inside faiss."""
    cand = _f32(candidate_emb)
    index = faiss.IndexFlatIP(cand.shape[1])
    index.add(cand)
    hist = np.zeros(len(cand), dtype=np.float64)
    for chunk in private_emb_iter:
        for s in range(0, len(chunk), batch):
            _, ids = index.search(_f32(chunk[s : s + batch]), k)
            hist += np.bincount(ids.ravel(), minlength=len(cand))
    return hist
