"""The one seam through which the methods touch private records: an engine that maps shard
kernels over the private records and reduces their partial statistics exactly
(docs/architecture.md, "Seams").

``compute.engine: local`` (the default, :mod:`dpsynth.compute.local`) holds every record in
one shard in this process; ``compute.engine: ray`` (:mod:`dpsynth.compute.ray_engine`) keeps
the private rows sharded by user on Ray actors and brings back only what the kernels return.
Both run the same kernels over the same partition (:mod:`dpsynth.compute.partition`) and the
same exact sums (:mod:`dpsynth.compute.kernels`), so for the same inputs and noise the release
is byte-identical. Noise is added once, by the driver's privacy session, to the summed
statistic (docs/methods.md §0). The package knows no method: a method's own kernels live with
the method and run through :meth:`PrivateCompute.map`.
"""

from __future__ import annotations

from ..on_shards import OnShards, engine_of
from .engine import PrivateCompute
from .kernels import Partial
from .local import LocalCompute, dataset_engine
from .shard import Shard, TextShard, shard_kernel

__all__ = ["LocalCompute", "OnShards", "Partial", "PrivateCompute", "Shard", "TextShard",
           "dataset_engine", "engine_of", "shard_kernel"]
