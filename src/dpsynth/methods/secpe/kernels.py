"""SecPE's shard kernels (docs/methods.md §3): what runs where the private records are, on
the one shard of the local engine or on every Ray shard actor.

* the secret scan: document frequencies of words by id (for random-word secrets), then per
  shard the records holding each secret (by secret id, never its value); the driver gets only
  counts and the public rows, the membership stays with the engine (a kept part);
* the SecretNoise plan (:func:`secret_plan_task`), where the membership is (a Ray task);
* the Poisson rates: each shard keeps (and saves in its private folder) its own rows' rates;
* per iteration, per label: the exact per-centre sums (on the 2^-32 grid) and counts of the
  sampled rows, clipped to R and assigned to their nearest public centre;
* the public rows' embeddings and labels (records without a secret, which SecPE treats as
  public), and the private rows' label counts (diagnostics and the vote's bookkeeping).

A shard's rates live in ``shard.state`` under :data:`RATES`; a shard restarted by Ray reloads
the last saved rates from its folder (:func:`shard_rates`).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...compute.kernels import FIXED_POINT_BITS, clipped_fixed_point
from ...compute.shard import Shard, shard_kernel, text_chunks
from ...files import atomic_write_bytes
from ...knn import nearest

#: ``shard.state`` key of SecPE's rates: (the plan's digest, the rates of ``shard.rows``)
RATES = "secpe.rates"


# -- the secret scan ---------------------------------------------------------------------------
@shard_kernel
def word_df_partial(shard: Shard) -> dict[int, int]:
    """Document frequency of every word (by its 64-bit hash, never the word) on the shard: the
    first pass of SecPE's random-word secrets (``secrets.choose_random_word_ids``)."""
    from ...secrets import doc_words, word_id

    df: dict[int, int] = {}
    for _, chunk in text_chunks(shard.text):
        for t in chunk:
            for w in doc_words(t):
                h = word_id(w)
                df[h] = df.get(h, 0) + 1
    return df


@shard_kernel
def secret_hits(shard: Shard, specs: Sequence[Any], chosen_words: dict[int, list[int]]
                ) -> list[dict[tuple[str, str], np.ndarray]]:
    """Per secret definition: {(type, secret id): global rows holding it} on the shard.
    Secret ids are hashes of the normalised values (``secrets.secret_id``), so the driver sees
    no secret value. ``chosen_words``: for random-word definitions (by index), the ids of the
    words drawn from the summed document frequencies."""
    from ...secrets import find_in_texts

    text = shard.text
    out: list[dict[tuple[str, str], list[np.ndarray]]] = [{} for _ in specs]
    for offset, chunk in text_chunks(text):
        for j, spec in enumerate(specs):
            hits = find_in_texts(chunk, spec, chosen_words.get(j))
            for key, local in hits.items():
                rows = text.rows[offset + np.asarray(sorted(local), dtype=np.int64)]
                out[j].setdefault(key, []).append(rows)
    return [{key: np.concatenate(v) for key, v in part.items()} for part in out]


@shard_kernel
def secret_scan_partial(shard: Shard, specs: Sequence[Any],
                        chosen_words: dict[int, list[int]]
                        ) -> tuple[dict[str, Any], list[dict[tuple[str, str], np.ndarray]]]:
    """(shown: counts and public rows, ``secrets.hit_facts``; kept: the shard's membership,
    :func:`secret_hits`, which only the SecretNoise plan reads)."""
    from ...secrets import hit_facts

    hits = secret_hits(shard, specs, chosen_words)
    return hit_facts(hits, shard.text.rows), hits


def secret_plan_task(specs: list[Any], n: int, p: float, r: float, T: int,
                     discretization: float, *parts: Any
                     ) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """SecPE's SecretNoise plan over the shards' membership ``parts`` (two results: the
    rates, for the shards, and the summary, with the pid of the process that solved it)."""
    from .theory import plan_from_hits

    rates, summary = plan_from_hits(list(parts), specs, n, p, r, T,
                                    discretization=discretization)
    return rates, {**summary, "pid": os.getpid()}


# -- the Poisson rates, kept by each shard ------------------------------------------------------
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


def rates_file(shard: Shard) -> Path:
    """Where a shard saves its rates: ``secpe-rates.npz`` in the driver's private folder
    (local engine), ``secpe-rates-shard-S-of-N.npz`` in a node's private compute folder."""
    return shard.private_file("secpe-rates", ".npz")


def save_rates(path: Path, digest: str, rows: np.ndarray, rates: np.ndarray) -> None:
    """Save SecPE's rates of ``rows`` under the plan's ``digest`` (0600, atomic)."""
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


@shard_kernel
def keep_rates(shard: Shard, digest: str, rates: tuple[np.ndarray, np.ndarray]) -> None:
    """Keep (and, with a private folder, save) this shard's rows' rates out of the plan's
    (private rows, rates)."""
    mine = rates_for_rows(rates, shard.rows)
    if shard.folder is not None:
        save_rates(rates_file(shard), digest, shard.rows, mine)
    shard.state[RATES] = (digest, mine)


def _reload(shard: Shard, digest: str | None) -> bool:
    saved = None if shard.folder is None else load_rates(rates_file(shard), digest)
    if saved is None or not np.array_equal(saved[0], shard.rows):
        return False
    shard.state[RATES] = (digest, saved[1])
    return True


@shard_kernel
def has_rates(shard: Shard, digest: str) -> bool:
    """Whether this shard holds (or reloads from its saved plan) the rates of ``digest``."""
    kept = shard.state.get(RATES)
    return (kept is not None and kept[0] == digest) or _reload(shard, digest)


def shard_rates(shard: Shard) -> np.ndarray:
    """The rates this shard keeps (a shard restarted by Ray: the last ones it saved)."""
    if RATES not in shard.state and not _reload(shard, None):
        raise RuntimeError("SecPE's sampling rates were not given to this shard")
    return shard.state[RATES][1]


# -- per iteration: the centre sums of the sampled rows -----------------------------------------
@shard_kernel(embeddings=True)
def centre_partial(shard: Shard, coins: np.ndarray, centres: dict[int, np.ndarray],
                   clip_R: float) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per label y: (sums [K_y, d] int64 on the 2^-32 grid, counts [K_y] int64) of the shard's
    sampled rows clipped to norm R and assigned to their nearest public centre (L2) of their
    label (docs/methods.md §3). Row i is sampled iff coins[i] < its rate (:func:`shard_rates`):
    ``coins`` holds one uniform per record, in global row order, drawn by the session."""
    sampled = np.asarray(coins)[shard.rows] < shard_rates(shard)
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


# -- the public rows and the private rows' labels -----------------------------------------------
@shard_kernel(embeddings=True)
def rows_embeddings(shard: Shard, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(global rows, embeddings) of the requested rows this shard holds (public rows only)."""
    keep = np.isin(shard.rows, rows)
    return shard.rows[keep], shard.emb[keep]


@shard_kernel
def rows_labels(shard: Shard, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(global rows, joint label codes) of the requested rows this shard holds (public rows
    only)."""
    keep = np.isin(shard.rows, rows)
    return shard.rows[keep], shard.labels[keep]


@shard_kernel
def masked_label_count_partial(shard: Shard, take: np.ndarray, n_labels: int) -> np.ndarray:
    """Label histogram (int64) of the shard's rows in ``take`` (a global boolean mask)."""
    return np.bincount(shard.labels[take[shard.rows]], minlength=n_labels).astype(np.int64)
