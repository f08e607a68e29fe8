"""Per-shard partial statistics and their exact, order-free sum (docs/methods.md §0).

Both engines (``local``: one shard in this process; ``ray``: one shard per actor) compute every
private statistic through these functions, so a release does not depend on how the records were
sharded:

* Records are partitioned by user: a record's *bucket* is a hash of its user id (of its row
  number at record level) modulo :data:`USER_BUCKETS`, and shard ``s`` of ``S`` holds the
  buckets ``b`` with ``b % S == s``. A user's whole contribution therefore sits on one shard
  and is bounded there, once, before any sum.
* Record level: partial votes are exact integers (Aug-PE: vote counts per candidate, the weight
  1/sqrt(k) is applied after the sum; WASP: votes times 2^(Q-1); SecPE: clipped embeddings on a
  2^-32 fixed-point grid, truncated toward zero so no row grows past the clip norm). Integer sums
  do not depend on the order of the shards.
* User level: each bucket's bounded sum is a float vector, computed from the same records in
  the same order whatever the shard count; the driver adds the buckets in bucket order.

Noise is never added here: the driver's privacy session noises the summed statistic once.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..evolution.voting import knn_vote, topq_vote, user_label_counts
from ..io import nearest
from ..privacy.lattice import truncate_to_grid

#: Buckets users are hashed into; fixed, so a run's sums are the same for any shard count
#: (the largest useful shard count).
USER_BUCKETS = 64
#: Fixed-point scale of SecPE's per-centre sums: coordinates are truncated to multiples of 2^-32.
FIXED_POINT_BITS = 32


def buckets_of(keys: Iterable[str]) -> np.ndarray:
    """Bucket of every user id (or row number as text): blake2b-64 of the key mod USER_BUCKETS."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(k.encode("utf-8"), digest_size=8).digest(), "little")
         % USER_BUCKETS for k in keys), dtype=np.int64)


def record_keys(n: int, users: Sequence[str] | None) -> list[str]:
    """Partition keys: the user ids at user level, else the row numbers."""
    return list(users) if users is not None else [str(i) for i in range(n)]


def shard_of(buckets: np.ndarray, shards: int) -> np.ndarray:
    """Shard index of each record (whole buckets per shard)."""
    return buckets % shards


@dataclass
class ShardData:
    """The private rows one shard holds: embeddings, label codes, global row numbers, buckets,
    and (user level) user ids. Never leaves the worker that built it."""

    emb: np.ndarray  # [m, d] float32
    labels: np.ndarray  # [m] int64 joint label codes
    rows: np.ndarray  # [m] int64 global row numbers, increasing
    buckets: np.ndarray  # [m] int64
    users: np.ndarray | None = None  # [m] user ids (str) at user level
    rates: np.ndarray | None = None  # [m] SecPE's Poisson rates (0: public), once planned

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class Partial:
    """A shard's partial statistic: an exact integer vector (record level) or the float sums of
    whole user buckets (user level)."""

    ints: np.ndarray | None = None
    buckets: dict[int, np.ndarray] = field(default_factory=dict)


def _user_codes(users: np.ndarray) -> np.ndarray:
    return np.unique(users, return_inverse=True)[1].astype(np.int64)


def _per_bucket(shard: ShardData, fn: Any) -> Partial:
    """fn(rows mask, user codes) for every user bucket on the shard (users in id order)."""
    out = Partial()
    assert shard.users is not None
    for b in np.unique(shard.buckets).tolist():
        sel = shard.buckets == b
        out.buckets[int(b)] = np.asarray(fn(sel, _user_codes(shard.users[sel])), np.float64)
    return out


def _exact_ints(values: np.ndarray, scale: np.ndarray | float, what: str) -> np.ndarray:
    """values * scale as int64, refusing anything that is not (numerically) an integer."""
    scaled = np.asarray(values, np.float64) * scale
    ints = np.rint(scaled)
    if not np.all(np.abs(scaled - ints) < 0.25):
        raise ArithmeticError(f"{what}: partial votes are not integral after scaling; "
                              "the exact cross-shard sum cannot be formed")
    return ints.astype(np.int64)


def knn_weights(cand_labels: np.ndarray, k: int) -> np.ndarray:
    """The weight 1/sqrt(min(k, candidates of its label)) each candidate's votes carry."""
    sizes = np.bincount(cand_labels)[cand_labels] if len(cand_labels) else np.zeros(0, int)
    kk = np.minimum(k, sizes)
    return 1.0 / np.sqrt(np.maximum(kk, 1).astype(np.float64))


def knn_partial(shard: ShardData, cand_emb: np.ndarray, cand_labels: np.ndarray, k: int,
                user_level: bool, **vote_options: Any) -> Partial:
    """Aug-PE votes of the shard's records (docs/methods.md §1): counts per candidate at
    record level, bounded per-bucket sums at user level (``voting.knn_vote``)."""
    if not user_level:
        hist = knn_vote(shard.emb, shard.labels, cand_emb, cand_labels, k, **vote_options)
        return Partial(ints=_exact_ints(hist, 1.0 / knn_weights(cand_labels, k), "knn votes"))
    return _per_bucket(shard, lambda sel, codes: knn_vote(
        shard.emb[sel], shard.labels[sel], cand_emb, cand_labels, k, users=codes,
        **vote_options))


def topq_partial(shard: ShardData, cand_emb: np.ndarray, cand_labels: np.ndarray, q: int,
                 user_level: bool, **vote_options: Any) -> Partial:
    """WASP's (H_near, H_far) of the shard's records (docs/methods.md §2): votes times 2^(Q-1)
    (exact integers) at record level, bounded per-bucket sums at user level."""
    if not user_level:
        hist = topq_vote(shard.emb, shard.labels, cand_emb, cand_labels, q, **vote_options)
        return Partial(ints=_exact_ints(hist, 2.0 ** (q - 1), "top-Q votes"))
    return _per_bucket(shard, lambda sel, codes: topq_vote(
        shard.emb[sel], shard.labels[sel], cand_emb, cand_labels, q, users=codes,
        **vote_options))


def label_count_partial(shard: ShardData, n_labels: int, user_level: bool) -> Partial:
    """Label histogram of the shard (sensitivity 1 per record, or per user)."""
    if not user_level:
        return Partial(ints=np.bincount(shard.labels, minlength=n_labels).astype(np.int64))
    return _per_bucket(shard, lambda sel, codes: user_label_counts(
        shard.labels[sel], n_labels, codes))


def masked_label_count_partial(shard: ShardData, take: np.ndarray, n_labels: int
                               ) -> np.ndarray:
    """Label histogram (int64) of the shard's rows in ``take`` (a global boolean mask)."""
    return np.bincount(shard.labels[take[shard.rows]], minlength=n_labels).astype(np.int64)


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


# -- SecPE: per-centre sums of clipped, Poisson-sampled private embeddings --------------------
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


def fixed_point_limit(clip_R: float, n_records: int) -> None:
    """Refuse sums that could overflow int64 on the 2^-32 grid."""
    if clip_R * max(n_records, 1) * 2.0 ** FIXED_POINT_BITS >= 2.0 ** 62:
        raise ValueError(f"clip R = {clip_R:g} with {n_records} records overflows the exact "
                         "fixed-point centre sums; lower secpe.clip")


def rates_for_rows(rates: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """SecPE's Poisson rate of each of ``rows`` from (private rows, sorted; their rates), the
    SecretNoise plan's output; 0 for rows not in it (public records)."""
    priv, rho = (np.asarray(a) for a in rates)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(rows), dtype=np.float64)
    if len(priv):
        pos = np.minimum(np.searchsorted(priv, rows), len(priv) - 1)
        hit = priv[pos] == rows
        out[hit] = rho[pos[hit]]
    return out


def rates_file(folder: Any, shard: int | None = None, shards: int = 1) -> Path:
    """Where SecPE's rates are saved: the driver's private folder (local engine), or a
    shard's private compute folder on its node."""
    name = "secpe-rates.npz" if shard is None else f"secpe-rates-shard-{shard}-of-{shards}.npz"
    return Path(folder) / name


def save_rates(path: Path, digest: str, rows: np.ndarray, rates: np.ndarray) -> None:
    """Save SecPE's rates of ``rows`` under the plan's ``digest`` (0600, atomic)."""
    from ..io import atomic_write_bytes

    buf = io.BytesIO()
    np.savez(buf, digest=np.array(digest), rows=np.asarray(rows, np.int64),
             rates=np.asarray(rates, np.float64))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue(), mode=0o600)


def load_rates(path: Path, digest: str | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, rates) saved under ``digest`` (None: whichever plan was saved last)."""
    if not path.is_file():
        return None
    with np.load(path) as saved:
        if digest is not None and str(saved["digest"]) != digest:
            return None
        return saved["rows"].copy(), saved["rates"].copy()


def centre_partial(shard: ShardData, coins: np.ndarray, centres: dict[int, np.ndarray],
                   clip_R: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per label y: (sums [K_y, d] int64 on the 2^-32 grid, counts [K_y] int64) of the shard's
    sampled rows clipped to norm R and assigned to their nearest public centre (L2) of their
    label (docs/methods.md §3). Row i is sampled iff coins[i] < its rate (``shard.rates``):
    ``coins`` holds one uniform per record, in global row order, drawn by the session."""
    if shard.rates is None:
        raise RuntimeError("SecPE's sampling rates were not given to this shard")
    sampled = np.asarray(coins)[shard.rows] < shard.rates
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for y, cent in sorted(centres.items()):
        c = np.ascontiguousarray(cent, dtype=np.float32)
        k, d = c.shape
        sums = np.zeros((k, d), dtype=np.int64)
        counts = np.zeros(k, dtype=np.int64)
        sel = sampled & (shard.labels == y)
        if sel.any():
            grid = clipped_fixed_point(shard.emb[sel], clip_R)
            x = (grid * 2.0 ** -FIXED_POINT_BITS).astype(np.float32)  # the clipped rows
            lab = nearest(x, c, 1, "l2")[1][:, 0]
            np.add.at(sums, lab, grid)
            counts += np.bincount(lab, minlength=k)
        out[y] = (sums, counts)
    return out


def sum_centre_partials(parts: Sequence[dict[int, tuple[np.ndarray, np.ndarray]]]
                        ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Exact sums of the shards' per-centre integer sums and counts; sums back to float64."""
    total: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for part in parts:
        for y, (s, c) in part.items():
            if y in total:
                total[y] = (total[y][0] + s, total[y][1] + c)
            else:
                total[y] = (s.copy(), c.copy())
    return {y: (s.astype(np.float64) * 2.0 ** -FIXED_POINT_BITS, c)
            for y, (s, c) in sorted(total.items())}


# -- statistics of the texts and labels (before any embedding) -------------------------------
@dataclass
class TextShard:
    """The private records one shard holds, before embedding: texts (read in chunks: a
    :class:`dpsynth.columns.TextColumn` view), label columns and user ids (all as strings),
    global row numbers and buckets. Never leaves the worker that built it."""

    texts: Sequence[str]
    labels: dict[str, Sequence[str]]
    rows: np.ndarray
    buckets: np.ndarray
    users: Sequence[str] | None = None

    def __len__(self) -> int:
        return len(self.rows)


def text_shard(dataset: Any, keys_users: Sequence[str] | None, shard: int = 0,
               shards: int = 1) -> TextShard:
    """Shard ``shard`` of ``shards`` of a loaded :class:`dpsynth.data.Dataset`, partitioned by
    ``keys_users`` (the user ids at user level, else None: by row)."""
    from ..data import _take

    buckets = buckets_of(record_keys(len(dataset), keys_users))
    rows = np.flatnonzero(shard_of(buckets, shards) == shard).astype(np.int64)
    return TextShard(texts=_take(dataset.texts, rows),
                     labels={c: _take(v, rows) for c, v in dataset.labels.items()},
                     rows=rows, buckets=buckets[rows],
                     users=None if dataset.users is None else _take(dataset.users, rows))


def _text_chunks(shard: TextShard, size: int = 4096) -> Iterable[tuple[int, list[str]]]:
    """(offset in the shard, texts) chunk by chunk."""
    from ..columns import chunks_of

    offset = 0
    for chunk in chunks_of(shard.texts, size):
        yield offset, chunk
        offset += len(chunk)


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


def label_value_partial(shard: TextShard, columns: Sequence[str], user_level: bool,
                        max_values: int = 1) -> dict[str, Partial | dict[str, Any]]:
    """Counts of the label values present, per column, for label-domain discovery
    (``dpsynth.label_domain``): record level, each record adds 1 to its value (exact ints);
    user level, per user bucket, each user adds :func:`user_value_weights` (at most
    ``max_values`` values per column, on the 2^-32 grid; users in id order, values in sorted
    order, so the float sums do not depend on the sharding)."""
    out: dict[str, Any] = {}
    for col in columns:
        values = np.asarray(list(shard.labels[col]), dtype=object)
        if not user_level:
            names, counts = np.unique(values, return_counts=True) if len(values) else ([], [])
            out[col] = {"ints": {str(v): int(c) for v, c in zip(names, counts, strict=True)}}
            continue
        assert shard.users is not None
        users = np.asarray(list(shard.users), dtype=object)
        per_bucket: dict[int, dict[str, float]] = {}
        for b in np.unique(shard.buckets).tolist():
            sel = shard.buckets == b
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


def keyword_partial(shard: TextShard, vocab: Any, k: int, fill: str, user_level: bool,
                    generator_factory: Any = None, max_new_tokens: int = 64) -> Partial:
    """DP-SynRAG's keyword histogram of the shard's documents (docs/methods.md §4): K keyword
    ids per document (``methods.synrag.keywords.extract_keywords``; with
    ``generator_factory`` the LLM extractor runs here, on the shard), then how many documents
    hold each vocabulary term. At user level a document is the user's records joined in row
    order (a whole user sits on one shard). Exact integers, summed by :func:`sum_partials`."""
    from ..methods.synrag.keywords import extract_keywords

    generate = None
    if generator_factory is not None:
        from ..llm import GenerationRequest, SamplingParams

        gen = generator_factory()
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)

        def generate(prompts: list) -> list[str]:
            return gen.generate([GenerationRequest(p, params) for p in prompts], progress=False)

    hist = np.zeros(len(vocab), dtype=np.int64)

    def count(docs: list[str]) -> None:
        for ids in extract_keywords(docs, vocab, k, generate=generate, fill=fill):
            np.add.at(hist, np.asarray(ids, dtype=np.int64), 1)

    if not user_level:
        for _, chunk in _text_chunks(shard):
            count(chunk)
        return Partial(ints=hist)
    assert shard.users is not None
    groups: dict[str, list[str]] = {}
    users = list(shard.users)
    for offset, chunk in _text_chunks(shard):
        for j, t in enumerate(chunk):
            groups.setdefault(users[offset + j], []).append(t)
    count(["\n".join(v) for v in groups.values()])
    return Partial(ints=hist)


def word_df_partial(shard: TextShard) -> dict[int, int]:
    """Document frequency of every word (by its 64-bit hash, never the word) on the shard: the
    first pass of SecPE's random-word secrets (``secrets.choose_random_word_ids``)."""
    from ..secrets import doc_words, word_id

    df: dict[int, int] = {}
    for _, chunk in _text_chunks(shard):
        for t in chunk:
            for w in doc_words(t):
                h = word_id(w)
                df[h] = df.get(h, 0) + 1
    return df


def sum_counts(parts: Sequence[dict[int, int]]) -> dict[int, int]:
    """Exact sum of integer count dicts."""
    out: dict[int, int] = {}
    for part in parts:
        for key, c in part.items():
            out[key] = out.get(key, 0) + c
    return out


def secret_partial(shard: TextShard, specs: Sequence[Any],
                   chosen_words: dict[int, list[int]]) -> list[dict[tuple[str, str], np.ndarray]]:
    """Per secret definition: {(type, secret id): global rows holding it} on the shard.
    Secret ids are hashes of the normalised values (``secrets.secret_id``), so the driver sees
    no secret value. ``chosen_words``: for random-word definitions (by index), the ids of the
    words drawn from the summed document frequencies."""
    from ..secrets import find_in_texts

    out: list[dict[tuple[str, str], list[np.ndarray]]] = [{} for _ in specs]
    for offset, chunk in _text_chunks(shard):
        for j, spec in enumerate(specs):
            hits = find_in_texts(chunk, spec, chosen_words.get(j))
            for key, local in hits.items():
                rows = shard.rows[offset + np.asarray(sorted(local), dtype=np.int64)]
                out[j].setdefault(key, []).append(rows)
    return [{key: np.concatenate(v) for key, v in part.items()} for part in out]


def secret_scan_partial(shard: TextShard, specs: Sequence[Any],
                        chosen_words: dict[int, list[int]]
                        ) -> tuple[dict[str, Any], list[dict[tuple[str, str], np.ndarray]]]:
    """(counts and public rows for the driver: ``secrets.hit_facts``; the shard's membership,
    :func:`secret_partial`, which stays with the engine: only the SecretNoise plan reads it)."""
    from ..secrets import hit_facts

    hits = secret_partial(shard, specs, chosen_words)
    return hit_facts(hits, shard.rows), hits


def shard_size(shard: TextShard) -> int:
    """Records on the shard (summed on the driver: the data set's size, private)."""
    return len(shard)
