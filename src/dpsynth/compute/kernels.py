"""Per-shard partial statistics and their exact, order-free sum (docs/methods.md §0).

Both engines (``local``: one shard in this process; ``ray``: one shard per actor) compute every
private statistic through shard kernels (:mod:`dpsynth.compute.shard`) over the same partition
(:mod:`dpsynth.compute.partition`: a user's records sit on one shard) and add them with the
sums here, so a release does not depend on how the records were sharded:

* Record level: partial statistics are exact integers (kNN votes: counts per candidate, the
  weight 1/sqrt(k) applied after the sum; Top-Q votes: times 2^(Q-1); sums of embeddings:
  clipped rows on a 2^-32 fixed-point grid, truncated toward zero so no row grows past the clip
  norm, :func:`clipped_fixed_point`). Integer sums do not depend on the order of the shards.
* User level: each bucket's bounded sum is a float vector, computed from the same records in
  the same order whatever the shard count; the driver adds the buckets in bucket order.

Noise is never added here: the driver's privacy session noises the summed statistic once. The
kernels here are those any method may ask for (label counts, the (label x length bin)
histogram, the kNN and Top-Q vote histograms, label values for domain discovery, the record
count); a method's own kernels live with the method (``dpsynth.methods.secpe.kernels``,
``dpsynth.methods.synrag.shard``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..privacy.lattice import truncate_to_grid
from ..voting import knn_vote, topq_vote, user_label_counts
from .shard import Shard, shard_kernel, text_chunks

#: Fixed-point scale of exact sums of embeddings: coordinates are truncated to multiples of
#: 2^-32.
FIXED_POINT_BITS = 32


@dataclass
class Partial:
    """A shard's partial statistic: an exact integer vector (record level) or the float sums of
    whole user buckets (user level)."""

    ints: np.ndarray | None = None
    buckets: dict[int, np.ndarray] = field(default_factory=dict)


def _user_codes(users: np.ndarray) -> np.ndarray:
    return np.unique(users, return_inverse=True)[1].astype(np.int64)


def per_bucket(shard: Shard, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Partial:
    """fn(rows mask, user codes) for every user bucket on the shard (users in id order)."""
    out = Partial()
    assert shard.users is not None
    for b in np.unique(shard.buckets).tolist():
        sel = shard.buckets == b
        out.buckets[int(b)] = np.asarray(fn(sel, _user_codes(shard.users[sel])), np.float64)
    return out


def exact_ints(values: np.ndarray, scale: np.ndarray | float, what: str) -> np.ndarray:
    """values * scale as int64, refusing anything that is not (numerically) an integer."""
    scaled = np.asarray(values, np.float64) * scale
    ints = np.rint(scaled)
    if not np.all(np.abs(scaled - ints) < 0.25):
        raise ArithmeticError(f"{what}: partial votes are not integral after scaling; "
                              "the exact cross-shard sum cannot be formed")
    return ints.astype(np.int64)


def sum_partials(parts: Sequence[Partial]) -> Partial:
    """Add shard partials: integers exactly; buckets must be disjoint (each on one shard)."""
    out = Partial()
    for part in parts:
        if part.ints is not None:
            out.ints = part.ints.copy() if out.ints is None else out.ints + part.ints
        for b, vec in part.buckets.items():
            if b in out.buckets:
                raise RuntimeError(f"user bucket {b} came from two shards: a user's records "
                                   "must sit on one shard")
            out.buckets[b] = vec
    return out


def finish(total: Partial, n: int, scale: np.ndarray | float = 1.0) -> np.ndarray:
    """The summed statistic as float64: ints * scale, or the buckets added in bucket order."""
    if total.ints is not None:
        return total.ints.astype(np.float64) * scale
    out = np.zeros(n, dtype=np.float64)
    for b in sorted(total.buckets):
        out = out + total.buckets[b]
    return out


def sum_counts(parts: Sequence[dict[Any, int]]) -> dict[Any, int]:
    """Exact sum of integer count dicts."""
    out: dict[Any, int] = {}
    for part in parts:
        for key, c in part.items():
            out[key] = out.get(key, 0) + c
    return out


def gather_rows(parts: Sequence[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
                ) -> np.ndarray:
    """Per-row values from the shards' answers (their global rows, the rows' values), in the
    order of ``rows`` (each row is held by exactly one shard)."""
    rows = np.asarray(rows, dtype=np.int64)
    got = np.concatenate([np.asarray(r, dtype=np.int64) for r, _ in parts])
    values = np.concatenate([v for _, v in parts if len(v)] or [parts[0][1]])
    order = np.argsort(got)
    pos = np.searchsorted(got[order], rows)
    return values[order][pos]


# -- exact sums of embeddings on the fixed-point grid ------------------------------------------
def clipped_fixed_point(x: np.ndarray, clip_R: float) -> np.ndarray:
    """Rows scaled (in float64) to L2 norm at most ``clip_R`` (1 - 2^-40), then truncated
    toward zero onto the 2^-32 grid (int64): truncation never grows a coordinate, so every row
    of the result has norm strictly below ``clip_R``. The L2 sensitivity the noise is
    calibrated for therefore holds exactly, whatever the float32 rounding of the embeddings (a
    unit-normalised float32 row can have norm 1 + 1e-7)."""
    x64 = np.asarray(x, dtype=np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", x64, x64))
    bound = clip_R * (1.0 - 2.0 ** -40)
    x64 = x64 * np.minimum(1.0, bound / np.maximum(norms, 1e-300))[:, None]
    return np.trunc(x64 * 2.0 ** FIXED_POINT_BITS).astype(np.int64)


def fixed_point_limit(clip_R: float, n_records: int, what: str, setting: str) -> None:
    """Refuse sums of ``n_records`` rows clipped to ``clip_R`` that could overflow int64 on the
    2^-32 grid (``what``: the sums, ``setting``: the config field that sets ``clip_R``)."""
    if clip_R * max(n_records, 1) * 2.0 ** FIXED_POINT_BITS >= 2.0 ** 62:
        raise ValueError(f"clip R = {clip_R:g} with {n_records} records overflows the exact "
                         f"fixed-point {what}; lower {setting}")


# -- the statistics any method may ask for -----------------------------------------------------
def knn_weights(cand_labels: np.ndarray, k: int) -> np.ndarray:
    """The weight 1/sqrt(min(k, candidates of its label)) each candidate's votes carry."""
    sizes = np.bincount(cand_labels)[cand_labels] if len(cand_labels) else np.zeros(0, int)
    kk = np.minimum(k, sizes)
    return 1.0 / np.sqrt(np.maximum(kk, 1).astype(np.float64))


@shard_kernel(embeddings=True)
def knn_partial(shard: Shard, cand_emb: np.ndarray, cand_labels: np.ndarray, k: int,
                **vote_options: Any) -> Partial:
    """kNN votes of the shard's records (docs/methods.md §1): counts per candidate at record
    level, bounded per-bucket sums at user level (``voting.knn_vote``)."""
    if not shard.user_level:
        hist = knn_vote(shard.emb, shard.labels, cand_emb, cand_labels, k, **vote_options)
        return Partial(ints=exact_ints(hist, 1.0 / knn_weights(cand_labels, k), "knn votes"))
    return per_bucket(shard, lambda sel, codes: knn_vote(
        shard.emb[sel], shard.labels[sel], cand_emb, cand_labels, k, users=codes,
        **vote_options))


@shard_kernel(embeddings=True)
def topq_partial(shard: Shard, cand_emb: np.ndarray, cand_labels: np.ndarray, q: int,
                 **vote_options: Any) -> Partial:
    """Top-Q (H_near, H_far) of the shard's records (docs/methods.md §2): votes times 2^(Q-1)
    (exact integers) at record level, bounded per-bucket sums at user level."""
    if not shard.user_level:
        hist = topq_vote(shard.emb, shard.labels, cand_emb, cand_labels, q, **vote_options)
        return Partial(ints=exact_ints(hist, 2.0 ** (q - 1), "top-Q votes"))
    return per_bucket(shard, lambda sel, codes: topq_vote(
        shard.emb[sel], shard.labels[sel], cand_emb, cand_labels, q, users=codes,
        **vote_options))


@shard_kernel
def label_count_partial(shard: Shard, n_labels: int) -> Partial:
    """Label histogram of the shard (sensitivity 1 per record, or per user)."""
    if not shard.user_level:
        return Partial(ints=np.bincount(shard.labels, minlength=n_labels).astype(np.int64))
    return per_bucket(shard, lambda sel, codes: user_label_counts(
        shard.labels[sel], n_labels, codes))


# -- the (label class x length bin) histogram: public bins (dpsynth.evolution.lengths) --
#: upper edges (exclusive) of the public word-count bins; the last bin is open
LENGTH_EDGES = (4, 8, 16, 32, 64, 128, 256)
N_BINS = len(LENGTH_EDGES) + 1


def length_bin(text: str) -> int:
    """The public bin of a text's word count."""
    return int(np.searchsorted(LENGTH_EDGES, len(text.split()), side="right"))


@shard_kernel
def label_length_partial(shard: Shard, n_labels: int) -> Partial:
    """The shard's exact (label class x length bin) histogram, flattened label-major; L2
    sensitivity 1 per record (or per user)."""
    bins = np.fromiter((length_bin(t) for _, chunk in text_chunks(shard.text) for t in chunk),
                       dtype=np.int64, count=len(shard))
    codes = shard.labels * N_BINS + bins
    if not shard.user_level:
        return Partial(ints=np.bincount(codes, minlength=n_labels * N_BINS).astype(np.int64))
    return per_bucket(shard, lambda sel, users: user_label_counts(
        codes[sel], n_labels * N_BINS, users))


@shard_kernel
def shard_size(shard: Shard) -> int:
    """Records on the shard (summed on the driver: the data set's size, private)."""
    return len(shard)


# -- label values present, for label-domain discovery (before any embedding) -------------------
def user_value_weights(values: Sequence[str], max_values: int) -> list[tuple[str, float]]:
    """One user's bounded contribution to a label column's value counts (docs/methods.md §0):
    the user's ``k' = min(k, m)`` most frequent of their ``m`` distinct values (``k`` =
    ``max_values``; most records first, ties broken by the smaller value), each weighted
    ``1 / sqrt(k')`` truncated toward zero onto the 2^-32 grid (an exact lattice sum for the
    discrete Gaussian release), so the contribution has L2 norm <= 1 and adds at most 1 to any
    value. The choice depends on this user's own records only. Returned in sorted value
    order."""
    if max_values < 1:
        raise ValueError(f"max_values must be >= 1, got {max_values}")
    freq: dict[str, int] = {}
    for v in values:
        freq[v] = freq.get(v, 0) + 1
    chosen = sorted(sorted(freq), key=lambda v: -freq[v])[:max_values]
    w = truncate_to_grid(1.0 / math.sqrt(len(chosen)))
    return [(v, w) for v in sorted(chosen)]


@shard_kernel
def label_value_partial(shard: Shard, columns: Sequence[str], max_values: int = 1
                        ) -> dict[str, dict[str, Any]]:
    """Counts of the label values present, per column, for label-domain discovery
    (``dpsynth.label_domain``): record level, each record adds 1 to its value (exact ints);
    user level, per user bucket, each user adds :func:`user_value_weights` (at most
    ``max_values`` values per column, on the 2^-32 grid; users in id order, values in sorted
    order, so the float sums do not depend on the sharding)."""
    text = shard.text
    out: dict[str, Any] = {}
    for col in columns:
        values = np.asarray(list(text.labels[col]), dtype=object)
        if not shard.user_level:
            names, counts = np.unique(values, return_counts=True) if len(values) else ([], [])
            out[col] = {"ints": {str(v): int(c) for v, c in zip(names, counts, strict=True)}}
            continue
        assert text.users is not None
        users = np.asarray(list(text.users), dtype=object)
        per_bucket: dict[int, dict[str, float]] = {}
        for b in np.unique(text.buckets).tolist():
            sel = text.buckets == b
            held: dict[str, list[str]] = {}
            for u, v in zip(users[sel].tolist(), values[sel].tolist(), strict=True):
                held.setdefault(u, []).append(v)
            totals: dict[str, float] = {}
            for u in sorted(held):
                for v, w in user_value_weights(held[u], max_values):
                    totals[v] = totals.get(v, 0.0) + w
            per_bucket[int(b)] = totals
        out[col] = {"buckets": per_bucket}
    return out


def sum_label_value_partials(parts: Sequence[dict[str, Any]], columns: Sequence[str]
                             ) -> dict[str, tuple[list[str], np.ndarray]]:
    """Per column: (the values present, sorted; their summed counts as float64). Integer counts
    add exactly; user buckets (each on one shard) add in bucket order."""
    out: dict[str, tuple[list[str], np.ndarray]] = {}
    for col in columns:
        ints: dict[str, int] = {}
        buckets: dict[int, dict[str, float]] = {}
        for part in parts:
            for v, c in part[col].get("ints", {}).items():
                ints[v] = ints.get(v, 0) + c
            for b, totals in part[col].get("buckets", {}).items():
                if b in buckets:
                    raise RuntimeError(f"user bucket {b} came from two shards")
                buckets[b] = totals
        if buckets:
            sums: dict[str, float] = {}
            for b in sorted(buckets):
                for v, x in buckets[b].items():
                    sums[v] = sums.get(v, 0.0) + x
            names = sorted(sums)
            out[col] = (names, np.array([sums[v] for v in names], dtype=np.float64))
        else:
            names = sorted(ints)
            out[col] = (names, np.array([ints[v] for v in names], dtype=np.float64))
    return out


