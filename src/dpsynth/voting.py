"""Private voting: each private record votes for synthetic candidates of its own label.

All functions return the *true* (noise-free) histogram; noise is added by the privacy session.
Nearest neighbours are found per label (labels partition the records, so a record's whole vote
lands inside its own label's block), over the candidates of that label only:

* ``exact`` (default): faiss exact inner-product search on unit vectors (= cosine);
* ``pq``: approximate search in two steps: a 4-bit product-quantisation fast-scan index scores
  every candidate cheaply, then the best ``rerank`` per neighbour asked for are re-scored
  exactly (faiss ``IndexPQFastScan`` + ``IndexRefineFlat``); the fastest ANN here at >= 99 %
  agreement on real MiniLM embeddings (benchmarks/results/knn.md);
* ``ivf`` / ``hnsw``: approximate search (faiss IVF-Flat or HNSW).

Every ANN index is built, and for PQ / IVF trained, on the *candidates* only, never on private
data, and each record still casts exactly one vote (docs/methods.md §1).

Memory: the private rows are ordered by label once (one argsort of the labels) and searched in
contiguous slices of that order, so at most one chunk of ``batch`` private rows is ever copied.

Determinism: the vote is a function of the data alone, whatever the thread count. faiss's BLAS
scores differ in the last bits between thread counts (and between identical rows), so where
the best ``k + 1`` are closer than float32 rounding can explain, the best ``k + 2`` found are
re-scored in float64 and ranked by (similarity desc, candidate index asc);
identical candidates are searched once and expanded in index order; ANN indexes are built on one
thread and IVF's choice of lists avoids BLAS. Ties go to the lowest candidate index. (Residual
case: more than k + 2 *distinct* candidates within float32 rounding of each other.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import faiss
import numpy as np
import scipy.sparse as sp

from dpsynth.knn import flat_index
from dpsynth.privacy.lattice import truncate_to_grid

if TYPE_CHECKING:
    from dpsynth.config import SynthesisConfig

SearchFn = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]
VoteIndexKind = Literal["exact", "pq", "ivf", "hnsw"]
_RESCORE_MARGIN = 2  # extra neighbours re-scored in float64 beyond the k asked for
_RESCORE_ROWS = 1024  # queries re-scored at once (bounds the float64 gather)
_PQ_IMPLEM = 13  # faiss fast-scan kernel: query blocks, the fastest measured here
_PQ_MIN = 256  # labels with fewer candidates are searched exactly under ``pq``


@dataclass(frozen=True)
class VoteIndex:
    """How each private record finds its nearest candidates (docs/methods.md §1).

    ``pq``: PQ fast-scan codes of ``pq_m`` sub-vectors x 4 bits (default d / 2, i.e. two
    dimensions per sub-vector) trained on the candidates; the ``rerank`` x k best by code are
    re-scored exactly. ``ivf``: IVF-Flat with ``nlist`` lists (default sqrt(n) for n
    candidates of a label, at most n / 39) trained by k-means on the candidates, ``nprobe``
    lists searched. ``hnsw``: HNSW graph over the candidates (``hnsw_m`` links,
    ``ef_construction``, ``ef_search``).
    A label with fewer than ``min_candidates`` candidates is searched exactly (ANN would not pay).
    """

    kind: VoteIndexKind = "exact"
    nlist: int | None = None
    nprobe: int = 8
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 64
    min_candidates: int = 2000
    pq_m: int | None = None
    rerank: int = 16

    def __post_init__(self) -> None:
        if self.kind not in ("exact", "pq", "ivf", "hnsw"):
            raise ValueError(f"voting index must be exact, pq, ivf or hnsw, got {self.kind!r}")
        for name in ("nprobe", "hnsw_m", "ef_construction", "ef_search", "min_candidates",
                     "rerank"):
            if getattr(self, name) < 1:
                raise ValueError(f"voting index {name} must be >= 1, got {getattr(self, name)}")
        if self.nlist is not None and self.nlist < 1:
            raise ValueError(f"voting index nlist must be >= 1, got {self.nlist}")
        if self.pq_m is not None and self.pq_m < 1:
            raise ValueError(f"voting index pq_m must be >= 1, got {self.pq_m}")


def vote_index_from(synthesis: SynthesisConfig) -> VoteIndex:
    """The VoteIndex of a SynthesisConfig (its ``voting*`` fields)."""
    return VoteIndex(kind=synthesis.voting, nlist=synthesis.voting_nlist,
                     nprobe=synthesis.voting_nprobe, ef_search=synthesis.voting_ef_search,
                     rerank=getattr(synthesis, "voting_rerank", VoteIndex.rerank))


def _as_index(index: VoteIndex | str | None) -> VoteIndex:
    if index is None:
        return VoteIndex()
    if isinstance(index, str):
        return VoteIndex(kind=index)  # type: ignore[arg-type]
    return index


def topq_sensitivity(q: int) -> float:
    """Joint L2 sensitivity of (H_near, H_far) for Top-Q voting with weights 2^-q (WASP).

    Each record adds the vector (2^0, ..., 2^-(Q-1)) to both histograms, so
    ||.||_2 = sqrt(2 * sum_{q<Q} 4^-q) = sqrt(8/3 * (1 - 4^-Q)).
    """
    if q < 1:
        raise ValueError("top_q must be >= 1")
    return math.sqrt(8.0 / 3.0 * (1.0 - 4.0 ** (-q)))


@contextmanager
def _faiss_threads(n: int) -> Iterator[None]:
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


@contextmanager
def _no_blas() -> Iterator[None]:
    """faiss flat search without BLAS (per-query SIMD loops: the same bits on any thread count).
    Process-wide while it lasts; another thread's flat search meanwhile is only slower."""
    before = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 2**30
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_threshold = before


class _LabelCandidates:
    """The candidates of one label: distinct rows, their members, and a search index."""

    def __init__(self, vectors: np.ndarray, ids: np.ndarray, spec: VoteIndex) -> None:
        vecs = np.ascontiguousarray(vectors, dtype=np.float32) + np.float32(0.0)  # -0.0 -> 0.0
        d = vecs.shape[1]
        rows = vecs.view(np.dtype((np.void, vecs.dtype.itemsize * d))).ravel()
        _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
        rank = np.argsort(first, kind="stable")  # distinct rows in order of first occurrence
        self.vecs = vecs[first[rank]]
        self.size = len(ids)
        relabel = np.empty_like(rank)
        relabel[rank] = np.arange(len(rank))
        group = relabel[inverse.ravel()]
        if len(self.vecs) == len(ids):
            self.members = ids[first[rank]][:, None]
        else:  # identical candidates: every member, in index order, padded with -1
            width = int(np.bincount(group).max())
            self.members = np.full((len(self.vecs), width), -1, dtype=np.int64)
            order = np.argsort(group, kind="stable")
            g = group[order]
            pos = np.arange(len(g)) - np.searchsorted(g, g)
            self.members[g, pos] = ids[order]
        self.max_norm = float(np.linalg.norm(self.vecs, axis=1).max())
        self.kind = spec.kind if len(self.vecs) >= spec.min_candidates else "exact"
        if self.kind == "pq" and len(self.vecs) < _PQ_MIN:
            self.kind = "exact"
        self.rerank = spec.rerank
        self.index = self._build(spec, d)

    def _build(self, spec: VoteIndex, d: int) -> faiss.Index:
        n = len(self.vecs)
        if self.kind == "exact":
            return flat_index(self.vecs, "ip")
        with _faiss_threads(1):  # single-threaded build: the same index on any thread count
            if self.kind == "pq":
                return self._build_pq(spec, d)
            if self.kind == "hnsw":
                index = faiss.IndexHNSWFlat(d, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
                index.hnsw.efConstruction = spec.ef_construction
                index.hnsw.efSearch = spec.ef_search
                index.add(self.vecs)
                return index
            nlist = spec.nlist or round(math.sqrt(n))
            nlist = max(1, min(nlist, n // 39))
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = 1234
            index.train(self.vecs)
            index.add(self.vecs)
            index.nprobe = min(spec.nprobe, nlist)
            self._quantizer = quantizer  # the IVF index does not own its quantizer
            return index

    def _build_pq(self, spec: VoteIndex, d: int) -> faiss.Index:
        """PQ fast-scan codes (4 bits per sub-vector) + an exact re-rank, trained on the
        candidates only. The sub-vectors have < 16 dimensions, so faiss builds each query's
        lookup table without BLAS: the shortlist is the same on any thread count."""
        m = spec.pq_m or (d // 2 if d % 2 == 0 else d)
        if d % m or d // m >= 16:
            raise ValueError(f"voting index pq_m must divide the dimension {d} into sub-vectors "
                             f"of < 16 dimensions, got {m}")
        base = faiss.IndexPQFastScan(d, m, 4, faiss.METRIC_INNER_PRODUCT)
        base.pq.cp.seed = 1234
        base.implem = _PQ_IMPLEM
        index = faiss.IndexRefineFlat(base)
        index.train(self.vecs)
        index.add(self.vecs)
        self._base = base  # the refine index does not own its base index
        return index

    def _tol(self, queries: np.ndarray, scale: float) -> np.ndarray:
        """Twice the float32 rounding bound of <query, row> for rows of norm <= scale."""
        return (4.0 * queries.shape[1] * 2.0**-24 * scale
                * np.linalg.norm(queries, axis=1, keepdims=True))

    def _raw(self, queries: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        if self.kind == "ivf":  # coarse step without BLAS: the same lists on any thread count
            with _no_blas():
                return self.index.search(queries, width)
        if self.kind == "hnsw":
            self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, width)
        if self.kind == "pq":  # shortlist rerank x (kk = width - margin) by code, then exact
            short = min(len(self.vecs), max(width, self.rerank * (width - _RESCORE_MARGIN)))
            self.index.k_factor = (short + 0.5) / width
        return self.index.search(queries, width)

    def nearest(self, queries: np.ndarray, kk: int) -> np.ndarray:
        """(B, kk) candidate ids, best first, ranked by similarity then lowest id.

        faiss's float32 scores are trusted where consecutive scores among the first kk + 1 are
        further apart than twice the float32 rounding bound of a d-term dot product; other rows
        (near-ties, identical candidates) are re-scored in float64 over the best kk + 2.
        """
        width = min(kk + _RESCORE_MARGIN, len(self.vecs))
        sims32, uid = self._raw(queries, width)
        if self.kind != "exact":  # ANN may find fewer than width: search those rows exactly
            short = np.flatnonzero((uid < 0).any(axis=1))
            if len(short):
                sims32[short], uid[short] = flat_index(self.vecs, "ip").search(queries[short],
                                                                              width)
        if self.members.shape[1] == 1:
            tol = self._tol(queries, self.max_norm)
            head = sims32[:, : min(kk + 1, width)].astype(np.float64)
            safe = (np.diff(-head, axis=1) > tol).all(axis=1)
            out = self.members[uid[:, :kk], 0]
            redo = np.flatnonzero(~safe)
        else:
            out = np.empty((len(queries), kk), dtype=np.int64)
            redo = np.arange(len(queries))
        for s in range(0, len(redo), _RESCORE_ROWS):
            rows = redo[s: s + _RESCORE_ROWS]
            sims = np.einsum("bd,bwd->bw", queries[rows].astype(np.float64),
                             self.vecs[uid[rows]].astype(np.float64))
            ids = self.members[uid[rows]]  # (b, width, multiplicity)
            sims = np.broadcast_to(sims[:, :, None], ids.shape).reshape(len(rows), -1)
            ids = ids.reshape(len(rows), -1)
            sims = np.where(ids < 0, -np.inf, sims)
            ids = np.where(ids < 0, np.iinfo(np.int64).max, ids)
            rank = np.lexsort((ids, -sims))[:, :kk]
            out[rows] = np.take_along_axis(ids, rank, axis=1)
        return out


def _label_slices(labels: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """Order the rows by label once: (order, [(label, start, stop)]) over that order."""
    labels = np.asarray(labels)
    order = np.argsort(labels, kind="stable")
    if labels.size == 0:  # no rows (e.g. an empty federated party): no slice
        return order, []
    values, starts = np.unique(labels[order], return_index=True)
    stops = np.append(starts[1:], len(order))
    return order, [(int(v), int(a), int(b)) for v, a, b in zip(values, starts, stops, strict=True)]


def _rows(private_emb: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """One chunk of private rows as float32: a view when the rows are contiguous."""
    if len(rows) and rows[-1] - rows[0] == len(rows) - 1:
        return np.ascontiguousarray(private_emb[rows[0]: rows[-1] + 1], dtype=np.float32)
    return np.ascontiguousarray(private_emb[rows], dtype=np.float32)


def _searches(private_emb: np.ndarray, private_labels: np.ndarray, cand_emb: np.ndarray,
              cand_labels: np.ndarray, k: int, index: VoteIndex | str | None, batch: int,
              directions: tuple[bool, ...]) -> Iterator[tuple[bool, np.ndarray, np.ndarray]]:
    """(furthest?, record rows, candidate ids) per chunk and direction; one index per label."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    spec = _as_index(index)
    if len(private_emb) != len(private_labels):
        raise ValueError(f"{len(private_emb)} private embeddings but {len(private_labels)} labels")
    if len(cand_emb) != len(cand_labels):
        raise ValueError(f"{len(cand_emb)} candidate embeddings but {len(cand_labels)} labels")
    c_order, c_slices = _label_slices(np.asarray(cand_labels))
    cands = {label: c_order[a:b] for label, a, b in c_slices}
    order, slices = _label_slices(np.asarray(private_labels))
    for label, start, stop in slices:
        cand_idx = cands.get(label)
        if cand_idx is None or len(cand_idx) == 0:
            continue  # no candidate of this label: these records cast no vote
        label_cands = _LabelCandidates(cand_emb[cand_idx], cand_idx, spec)
        kk = min(k, label_cands.size)
        for s in range(start, stop, batch):
            rows = order[s: min(s + batch, stop)]
            queries = _rows(private_emb, rows)
            for far in directions:
                yield far, rows, label_cands.nearest(-queries if far else queries, kk)


def nearest_candidates(private_emb: np.ndarray, private_labels: np.ndarray,
                       cand_emb: np.ndarray, cand_labels: np.ndarray, k: int = 1, *,
                       index: VoteIndex | str | None = None, batch: int = 8192,
                       furthest: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """For each chunk of private records: (record indices [B], candidate indices [B, kk]), the
    record's kk = min(k, candidates of its label) nearest candidates of its own label, best
    first (``furthest``: the kk furthest). Records of a label without candidates are skipped.

    The index is built on the candidates only (docs/methods.md §1); private rows are ordered by
    label once and copied at most one chunk at a time.
    """
    for _, rows, ids in _searches(private_emb, private_labels, cand_emb, cand_labels, k, index,
                                  batch, (furthest,)):
        yield rows, ids


def _bound_users(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, users: np.ndarray,
                 n_cols: int, max_norm: float) -> np.ndarray:
    """Sum votes per user, scale each user's vote vector to L2 norm <= max_norm, truncate it
    toward zero onto the public fixed-point grid (FIXED_POINT_GRID, so the norm stays <=
    max_norm and the sum is an exact lattice statistic for the discrete Gaussian release,
    docs/methods.md §0), add up.

    rows index private records; `users` maps each record to a user id (int codes).
    """
    n_users = int(users.max()) + 1 if len(users) else 0
    per_user = sp.csr_matrix((vals, (users[rows], cols)), shape=(n_users, n_cols))
    norms = np.sqrt(np.asarray(per_user.multiply(per_user).sum(axis=1))).ravel()
    scale = np.minimum(1.0, max_norm / np.maximum(norms, 1e-12))
    if not n_users:
        return np.zeros(n_cols)
    bounded = (sp.diags(scale) @ per_user).tocsr()
    bounded.data = truncate_to_grid(bounded.data)
    return np.asarray(bounded.sum(axis=0)).ravel()



def _scatter(n: int, cols: np.ndarray, vals: np.ndarray) -> np.ndarray:
    return np.bincount(cols, weights=vals, minlength=n).astype(np.float64)


def knn_vote(private_emb: np.ndarray, private_labels: np.ndarray, cand_emb: np.ndarray,
             cand_labels: np.ndarray, k: int = 1, users: np.ndarray | None = None,
             batch: int = 8192, *, index: VoteIndex | str | None = None) -> np.ndarray:
    """Aug-PE vote (docs/methods.md §1, step 3b): each record gives 1/sqrt(k) to its k nearest
    candidates of the same label, so each record's vote vector has L2 norm 1 (sensitivity 1),
    whichever ``index`` (exact, ivf, hnsw) finds the neighbours.

    With `users` (int codes per record), each user's summed vote vector is scaled to norm 1.
    """
    n = len(cand_emb)
    hist = np.zeros(n, dtype=np.float64)
    all_rows, all_cols, all_vals = [], [], []
    for rows, ids in nearest_candidates(private_emb, private_labels, cand_emb, cand_labels, k,
                                        index=index, batch=batch):
        kk = ids.shape[1]
        cols = ids.ravel()
        vals = np.full(cols.shape, 1.0 / math.sqrt(kk))
        if users is None:
            hist += _scatter(n, cols, vals)
        else:
            all_rows.append(np.repeat(rows, kk))
            all_cols.append(cols)
            all_vals.append(vals)
    if users is not None and all_rows:
        hist = _bound_users(np.concatenate(all_rows), np.concatenate(all_cols),
                            np.concatenate(all_vals), np.asarray(users), n, 1.0)
    return hist


def topq_vote(private_emb: np.ndarray, private_labels: np.ndarray, cand_emb: np.ndarray,
              cand_labels: np.ndarray, q: int = 8, users: np.ndarray | None = None,
              batch: int = 8192, *, index: VoteIndex | str | None = None) -> np.ndarray:
    """WASP Top-Q vote (docs/methods.md §2, step 2): the q-th nearest candidate of the record's
    label gets 2^-q in H_near and the q-th furthest gets 2^-q in H_far.

    Returns concat(H_near, H_far) (length 2N); joint sensitivity `topq_sensitivity(q)`.
    """
    n = len(cand_emb)
    weights_by_rank = 2.0 ** -np.arange(q)
    out = np.zeros(2 * n, dtype=np.float64)
    all_rows, all_cols, all_vals = [], [], []
    for far, rows, ids in _searches(private_emb, private_labels, cand_emb, cand_labels, q, index,
                                    batch, (False, True)):
        qq = ids.shape[1]
        cols = (n if far else 0) + ids.ravel()
        vals = np.tile(weights_by_rank[:qq], len(rows))
        if users is None:
            out += _scatter(2 * n, cols, vals)
        else:
            all_rows.append(np.repeat(rows, qq))
            all_cols.append(cols)
            all_vals.append(vals)
    if users is not None and all_rows:
        out = _bound_users(np.concatenate(all_rows), np.concatenate(all_cols),
                           np.concatenate(all_vals), np.asarray(users), 2 * n,
                           topq_sensitivity(q))
    return out


def user_label_counts(labels: np.ndarray, n_labels: int, users: np.ndarray | None) -> np.ndarray:
    """Label histogram with L2 sensitivity 1: per record, or per user (each user's count
    vector scaled to norm <= 1)."""
    if users is None:
        return np.bincount(labels, minlength=n_labels).astype(np.float64)
    rows = np.arange(len(labels))
    return _bound_users(rows, labels, np.ones(len(labels)), users, n_labels, 1.0)
