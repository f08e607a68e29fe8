"""A test engine: the production partition and shard kernels over several shards built in
this process (no Ray), summed by the production engine code (dpsynth.compute.engine)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpsynth.compute import PrivateCompute, Shard
from dpsynth.compute.partition import buckets_of, record_keys, shard_of
from dpsynth.compute.shard import check_kernel, text_shard


def array_shards(emb: np.ndarray, labels: np.ndarray, users: Sequence[str] | None,
                 shards: int) -> list[Shard]:
    """The production partition of in-memory embeddings and label codes into ``shards``."""
    buckets = buckets_of(record_keys(len(emb), users))
    out = []
    for s in range(shards):
        rows = np.flatnonzero(shard_of(buckets, shards) == s)
        out.append(Shard.of_arrays(
            emb[rows], np.asarray(labels)[rows], rows, buckets[rows],
            None if users is None else np.asarray([users[i] for i in rows], object), s,
            shards))
    return out


def dataset_shards(dataset: Any, user_level: bool, shards: int) -> list[Shard]:
    """The production partition of a loaded dataset's records (texts and label codes; no
    embeddings) into ``shards``."""
    users = dataset.users if user_level else None
    out = []
    for s in range(shards):
        text = text_shard(dataset, users, s, shards)

        def codes(rows: np.ndarray = text.rows) -> np.ndarray:
            return np.asarray(dataset.joint_label_codes()[0], dtype=np.int64)[rows]

        out.append(Shard(s, shards, rows=text.rows, buckets=text.buckets,
                         users=None if users is None else np.asarray(list(text.users or ()),
                                                                     dtype=object),
                         labels=codes, text=lambda text=text: text))
    return out


class InProcessShards(PrivateCompute):
    """The kernels over ``shards`` shards in this process, in shard order."""

    engine = "in-process"

    def __init__(self, shards: list[Shard]) -> None:
        super().__init__(user_level=shards[0].user_level)
        self.shards = shards

    def map(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        check_kernel(kernel)
        return [kernel(s, *args, **kwargs) for s in self.shards]

    def map_keeping(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> tuple[list[Any], list[Any]]:
        pairs = self.map(kernel, *args, **kwargs)
        return [a for a, _ in pairs], [b for _, b in pairs]

    def off_driver(self, fn: Callable[..., Any], *args: Any, returns: int = 1) -> Any:
        return fn(*args)
