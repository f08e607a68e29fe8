"""Private voting: each private record votes for synthetic candidates of its own label.

All functions return the *true* (noise-free) histogram; noise is added by the privacy session.
Nearest neighbours come from faiss exact inner-product search on unit vectors (= cosine),
batched over private records so memory stays bounded, one index per label (labels partition
the records, so a record's whole vote lands inside its own label's block).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import faiss
import numpy as np
import scipy.sparse as sp

SearchFn = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def topq_sensitivity(q: int) -> float:
    """Joint L2 sensitivity of (H_near, H_far) for Top-Q voting with weights 2^-q (WASP).

    Each record adds the vector (2^0, ..., 2^-(Q-1)) to both histograms, so
    ||.||_2 = sqrt(2 * sum_{q<Q} 4^-q) = sqrt(8/3 * (1 - 4^-Q)).
    """
    if q < 1:
        raise ValueError("top_q must be >= 1")
    return math.sqrt(8.0 / 3.0 * (1.0 - 4.0 ** (-q)))


def _search(index_vectors: np.ndarray, queries: np.ndarray, k: int,
            batch: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products of queries against index_vectors, in bounded batches."""
    index = faiss.IndexFlatIP(index_vectors.shape[1])
    index.add(np.ascontiguousarray(index_vectors, dtype=np.float32))
    sims = np.empty((len(queries), k), dtype=np.float32)
    ids = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), batch):
        stop = start + batch
        sims[start:stop], ids[start:stop] = index.search(
            np.ascontiguousarray(queries[start:stop], dtype=np.float32), k
        )
    return sims, ids


def _by_label(labels: np.ndarray) -> dict[int, np.ndarray]:
    order = np.argsort(labels, kind="stable")
    values, starts = np.unique(labels[order], return_index=True)
    return dict(zip(values.tolist(), np.split(order, starts[1:]), strict=True))


def _bound_users(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, users: np.ndarray,
                 n_cols: int, max_norm: float) -> np.ndarray:
    """Sum votes per user, scale each user's vote vector to L2 norm <= max_norm, add up.

    rows index private records; `users` maps each record to a user id (int codes).
    """
    n_users = int(users.max()) + 1 if len(users) else 0
    per_user = sp.csr_matrix((vals, (users[rows], cols)), shape=(n_users, n_cols))
    norms = np.sqrt(np.asarray(per_user.multiply(per_user).sum(axis=1))).ravel()
    scale = np.minimum(1.0, max_norm / np.maximum(norms, 1e-12))
    if not n_users:
        return np.zeros(n_cols)
    return np.asarray((sp.diags(scale) @ per_user).sum(axis=0)).ravel()


def _scatter(n: int, cols: np.ndarray, vals: np.ndarray) -> np.ndarray:
    return np.bincount(cols, weights=vals, minlength=n).astype(np.float64)


def knn_vote(private_emb: np.ndarray, private_labels: np.ndarray, cand_emb: np.ndarray,
             cand_labels: np.ndarray, k: int = 1, users: np.ndarray | None = None,
             batch: int = 8192) -> np.ndarray:
    """Aug-PE vote (METHODS.md 1.3b): each record gives 1/sqrt(k) to its k nearest candidates
    of the same label, so each record's vote vector has L2 norm 1 (sensitivity 1).

    With `users` (int codes per record), each user's summed vote vector is scaled to norm 1.
    """
    hist = np.zeros(len(cand_emb), dtype=np.float64)
    all_rows, all_cols, all_vals = [], [], []
    cands = _by_label(cand_labels)
    for label, rec_idx in _by_label(private_labels).items():
        cand_idx = cands.get(label)
        if cand_idx is None or len(cand_idx) == 0:
            continue  # no candidate of this label: these records cast no vote
        kk = min(k, len(cand_idx))
        _, ids = _search(cand_emb[cand_idx], private_emb[rec_idx], kk, batch)
        cols = cand_idx[ids].ravel()
        vals = np.full(cols.shape, 1.0 / math.sqrt(kk))
        if users is None:
            hist += _scatter(len(cand_emb), cols, vals)
        else:
            all_rows.append(np.repeat(rec_idx, kk))
            all_cols.append(cols)
            all_vals.append(vals)
    if users is not None and all_rows:
        hist = _bound_users(np.concatenate(all_rows), np.concatenate(all_cols),
                            np.concatenate(all_vals), users, len(cand_emb), 1.0)
    return hist


def topq_vote(private_emb: np.ndarray, private_labels: np.ndarray, cand_emb: np.ndarray,
              cand_labels: np.ndarray, q: int = 8, users: np.ndarray | None = None,
              batch: int = 8192) -> np.ndarray:
    """WASP Top-Q vote (METHODS.md 2.2): the q-th nearest candidate of the record's label gets
    2^-q in H_near and the q-th furthest gets 2^-q in H_far.

    Returns concat(H_near, H_far) (length 2N); joint sensitivity `topq_sensitivity(q)`.
    """
    n = len(cand_emb)
    weights_by_rank = 2.0 ** -np.arange(q)
    out = np.zeros(2 * n, dtype=np.float64)
    all_rows, all_cols, all_vals = [], [], []
    cands = _by_label(cand_labels)
    for label, rec_idx in _by_label(private_labels).items():
        cand_idx = cands.get(label)
        if cand_idx is None or len(cand_idx) == 0:
            continue
        qq = min(q, len(cand_idx))
        _, near = _search(cand_emb[cand_idx], private_emb[rec_idx], qq, batch)
        _, far = _search(cand_emb[cand_idx], -private_emb[rec_idx], qq, batch)
        w = np.tile(weights_by_rank[:qq], len(rec_idx))
        cols = np.concatenate([cand_idx[near].ravel(), n + cand_idx[far].ravel()])
        vals = np.concatenate([w, w])
        if users is None:
            out += _scatter(2 * n, cols, vals)
        else:
            rows = np.repeat(rec_idx, qq)
            all_rows.append(np.concatenate([rows, rows]))
            all_cols.append(cols)
            all_vals.append(vals)
    if users is not None and all_rows:
        out = _bound_users(np.concatenate(all_rows), np.concatenate(all_cols),
                           np.concatenate(all_vals), users, 2 * n, topq_sensitivity(q))
    return out


def user_label_counts(labels: np.ndarray, n_labels: int, users: np.ndarray | None) -> np.ndarray:
    """Label histogram with L2 sensitivity 1: per record, or per user (each user's count
    vector scaled to norm <= 1)."""
    if users is None:
        return np.bincount(labels, minlength=n_labels).astype(np.float64)
    rows = np.arange(len(labels))
    return _bound_users(rows, labels, np.ones(len(labels)), users, n_labels, 1.0)
