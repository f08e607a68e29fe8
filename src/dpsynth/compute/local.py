"""``compute.engine: local`` (the default): one shard holding every private record, in this
process (docs/methods.md §0). The same kernels and exact sums as the Ray engine, so for the
same inputs and noise the release is byte-identical."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..on_shards import engine_of
from .engine import PrivateCompute
from .partition import buckets_of
from .shard import Shard, check_kernel, text_shard

__all__ = ["LocalCompute", "dataset_engine"]


class LocalCompute(PrivateCompute):
    """One shard, this process.

    ``embeddings``: the private embeddings (a callable: computed on first use, e.g. the run's
    streamed cache); ``labels``: the joint label code of every record (an array, or a callable
    read on first use); ``users``: the user ids at user level (None: record level);
    ``dataset``: the loaded :class:`dpsynth.data.Dataset`, for the kernels that read texts and
    label columns; ``folder``: the run's private area, where kernels keep their files."""

    engine = "local"

    def __init__(self, embeddings: Callable[[], np.ndarray] | None,
                 labels: np.ndarray | Callable[[], np.ndarray] | None,
                 users: Sequence[str] | None, dataset: Any = None, *,
                 folder: Path | None = None) -> None:
        super().__init__(user_level=users is not None)
        self._embeddings = embeddings
        self._labels = labels
        self._users = None if users is None else np.asarray(list(users), dtype=object)
        self._dataset = dataset
        self._folder = folder
        self._shard: Shard | None = None

    @classmethod
    def for_dataset(cls, dataset: Any, user_level: bool, folder: Path | None = None,
                    embeddings: Callable[[], np.ndarray] | None = None) -> LocalCompute:
        """The statistics of a loaded dataset's texts and labels here, and of its
        ``embeddings`` when given (e.g. :class:`~dpsynth.compute.embeddings.
        PrivateEmbeddings`)."""
        return cls(embeddings, lambda: dataset.joint_label_codes()[0],
                   dataset.users if user_level else None, dataset, folder=folder)

    def _n(self) -> int:
        if self._dataset is not None:
            return len(self._dataset)
        if self._users is not None:
            return len(self._users)
        return len(self._label_codes())

    def _label_codes(self) -> np.ndarray:
        labels = self._labels() if callable(self._labels) else self._labels
        if labels is None:
            raise RuntimeError("this LocalCompute was built without label codes")
        return np.asarray(labels, dtype=np.int64)

    def _text(self) -> Any:
        if self._dataset is None:
            raise RuntimeError("this LocalCompute was built without the dataset")
        return text_shard(self._dataset, self._users)

    def _emb(self) -> np.ndarray:
        if self._embeddings is None:
            raise RuntimeError("this LocalCompute holds no embeddings (for_dataset)")
        return self._embeddings()

    @property
    def shard(self) -> Shard:
        """The one shard: every record, in row order."""
        if self._shard is None:
            n = self._n()
            # buckets order the user-level sums; record-level sums are exact integers
            buckets = (buckets_of(list(self._users)) if self._users is not None
                       else np.zeros(n, dtype=np.int64))
            self._shard = Shard(0, 1, rows=np.arange(n, dtype=np.int64), buckets=buckets,
                                users=self._users, labels=self._label_codes,
                                embeddings=self._emb, text=self._text, folder=self._folder,
                                in_driver=True)
        return self._shard

    def map(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        check_kernel(kernel)
        return [kernel(self.shard, *args, **kwargs)]

    def map_keeping(self, kernel: Callable[..., Any], *args: Any, **kwargs: Any
                    ) -> tuple[list[Any], list[Any]]:
        shown, kept = self.map(kernel, *args, **kwargs)[0]
        return [shown], [kept]

    def off_driver(self, fn: Callable[..., Any], *args: Any, returns: int = 1) -> Any:
        return fn(*args)


def dataset_engine(dataset: Any, user_level: bool, folder: Path | None = None
                   ) -> PrivateCompute:
    """The engine over a dataset's records: the Ray shards of a
    :class:`dpsynth.compute.sharded.ShardedDataset` (which hold them), else this process
    (``folder``: where its kernels keep files)."""
    engine = engine_of(dataset)
    if engine is not None:
        return engine
    return LocalCompute.for_dataset(dataset, user_level, folder)
