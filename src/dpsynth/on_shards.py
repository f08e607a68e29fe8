"""Where a dataset's records are: on an engine's shards, or in this process.

A :class:`dpsynth.compute.sharded.ShardedDataset` holds no record in this process; the engine
that holds them (``compute.engine: ray``) is the one every kernel over them must use. Callers
ask through :func:`engine_of`, the one typed seam, instead of probing the dataset. This module
imports nothing heavy, so the runner can ask without loading the compute package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .compute.engine import PrivateCompute


@runtime_checkable
class OnShards(Protocol):
    """A dataset whose records live on an engine's shards."""

    compute: PrivateCompute


def engine_of(dataset: object) -> PrivateCompute | None:
    """The engine holding ``dataset``'s records (:class:`OnShards`); None when they are in
    this process."""
    return dataset.compute if isinstance(dataset, OnShards) else None


__all__ = ["OnShards", "engine_of"]
