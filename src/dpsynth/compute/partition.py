"""How the private records are split over shards (docs/methods.md §0): by user.

A record's *bucket* is a hash of its user id (of its row number at record level) modulo
:data:`USER_BUCKETS`, and shard ``s`` of ``S`` holds the buckets ``b`` with ``b % S == s``. A
user's whole contribution therefore sits on one shard and is bounded there, once, before any
sum; the buckets fix the order of user-level sums, so a release does not depend on ``S``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np

#: Buckets users are hashed into; fixed, so a run's sums are the same for any shard count
#: (the largest useful shard count).
USER_BUCKETS = 64


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
