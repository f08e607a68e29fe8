"""How a simulated federated run splits the records over its parties (docs/methods.md §2).

A real federation's parties are given; the simulation makes them. For the record-level
guarantee the split must be *record-local*: adding or removing one record may change only
the party that record joins, never move other records (else the neighbouring datasets would
differ in every party's votes, and the per-party vote clipping would not keep the
sensitivity). So:

* the party shares p ~ Dirichlet(alpha * 1_P) are drawn from the run's post-processing
  randomness, independent of the data (their number, not the record count, is the input);
* record r goes to party F_p^-1(u_r), with u_r in [0, 1) a keyed hash of the record alone
  (its text and label code), so its party depends on nothing but the record, the key and p.

Parties may be empty: an empty party takes part like any other (zero votes plus its noise
share), so neither the number of parties nor any round parameter depends on party sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_U64 = float(2**64)


def dirichlet_shares(parties: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Party shares p ~ Dirichlet(alpha, ..., alpha) over ``parties`` parties (data-free)."""
    if parties < 2:
        raise ValueError(f"a federated split needs >= 2 parties, got {parties}")
    if not alpha > 0:
        raise ValueError(f"dirichlet_alpha must be > 0, got {alpha!r}")
    return np.asarray(rng.dirichlet(np.full(parties, float(alpha))), dtype=np.float64)


def record_uniform(text: str, label: int, key: bytes) -> float:
    """u_r in [0, 1): a keyed BLAKE2b hash of one record (its text and label code) alone."""
    h = hashlib.blake2b(f"{int(label)}\x1f{text}".encode(), digest_size=8, key=key)
    return int.from_bytes(h.digest(), "little") / _U64


def record_owners(texts: Sequence[str], labels: np.ndarray, shares: np.ndarray,
                  key: bytes) -> np.ndarray:
    """The party of every record: the inverse CDF of ``shares`` at the record's own hash
    (record-local: another record's presence never changes it)."""
    labels = np.asarray(labels)
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    u = np.fromiter((record_uniform(t, int(y), key) for t, y in zip(texts, labels, strict=True)),
                    dtype=np.float64, count=len(texts))
    cdf = np.cumsum(np.asarray(shares, dtype=np.float64))
    owner = np.searchsorted(cdf, u * cdf[-1], side="right")
    return np.minimum(owner, len(cdf) - 1).astype(np.int64)


def split_records(owners: np.ndarray, parties: int) -> list[np.ndarray]:
    """Record indices per party (possibly empty), in record order."""
    owners = np.asarray(owners)
    return [np.flatnonzero(owners == p) for p in range(parties)]
