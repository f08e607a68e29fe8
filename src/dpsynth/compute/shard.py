"""One shard of private records as a kernel sees it (docs/architecture.md, "Seams").

A *shard kernel* is a module-level function ``kernel(shard, *args, **kwargs)`` marked with
:func:`shard_kernel`; an engine (:mod:`dpsynth.compute.engine`) runs it on every shard and
brings back what it returns: a partial statistic, never a record. The engine knows no
method: a method's kernels live with the method and keep their per-shard state (SecPE's
sampling rates, DP-SynRAG's documents) in :attr:`Shard.state`, under a key of their own, and
their files in the shard's private folder (:meth:`Shard.private_file`).

A :class:`Shard` holds its records' global row numbers, partition buckets and (user level)
user ids, and reads the rest on first use: the joint label codes, the embeddings and the texts
with their label columns (:class:`TextShard`). It never leaves the process that holds it (the
driver with the local engine, a Ray actor with the ray engine).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .partition import buckets_of, record_keys, shard_of

__all__ = ["Shard", "TextShard", "kernel_reads_embeddings", "shard_kernel", "text_chunks",
           "text_shard"]

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__shard_kernel__"


def shard_kernel(fn: F | None = None, *, embeddings: bool = False) -> Any:
    """Mark ``fn`` as a shard kernel (engines run nothing else on a shard); ``embeddings``:
    it reads :attr:`Shard.emb` (the ray engine has its shards embed before it runs)."""

    def mark(f: F) -> F:
        setattr(f, _MARK, "embeddings" if embeddings else "records")
        return f

    return mark(fn) if fn is not None else mark


def check_kernel(kernel: Any) -> None:
    """Refuse anything but a :func:`shard_kernel` (ValueError)."""
    if getattr(kernel, _MARK, None) is None:
        raise ValueError(f"{getattr(kernel, '__qualname__', kernel)!r} is not a shard kernel "
                         "(dpsynth.compute.shard_kernel)")


def kernel_reads_embeddings(kernel: Any) -> bool:
    """Whether a shard kernel reads the shard's embeddings."""
    return getattr(kernel, _MARK, None) == "embeddings"


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
    from ..data import take_rows

    buckets = buckets_of(record_keys(len(dataset), keys_users))
    rows = np.flatnonzero(shard_of(buckets, shards) == shard).astype(np.int64)
    return TextShard(texts=take_rows(dataset.texts, rows),
                     labels={c: take_rows(v, rows) for c, v in dataset.labels.items()},
                     rows=rows, buckets=buckets[rows],
                     users=None if dataset.users is None else take_rows(dataset.users, rows))


def text_chunks(shard: TextShard, size: int = 4096) -> Iterable[tuple[int, list[str]]]:
    """(offset in the shard, texts) chunk by chunk."""
    from ..columns import chunks_of

    offset = 0
    for chunk in chunks_of(shard.texts, size):
        yield offset, chunk
        offset += len(chunk)


def _no_texts() -> TextShard:
    raise RuntimeError("this shard was built without its texts")


def _no_embeddings() -> np.ndarray:
    raise RuntimeError("this shard holds no embeddings (no embedder was given)")


class Shard:
    """The private records of one shard (see the module docstring).

    ``rows``: global row numbers, increasing; ``buckets``: their partition buckets;
    ``users``: their user ids at user level (None at record level). ``labels``,
    ``embeddings`` and ``text`` load the joint label codes, the embeddings ([m, d] float32)
    and the :class:`TextShard` on first use. ``folder``: the private folder where kernels keep
    files (None: nowhere); ``in_driver``: the one shard of the local engine, in the driver's
    process."""

    def __init__(self, index: int, shards: int, *, rows: np.ndarray, buckets: np.ndarray,
                 users: np.ndarray | None, labels: Callable[[], np.ndarray],
                 embeddings: Callable[[], np.ndarray] = _no_embeddings,
                 text: Callable[[], TextShard] = _no_texts, folder: Path | None = None,
                 in_driver: bool = False) -> None:
        self.index, self.shards = index, shards
        self.rows = np.asarray(rows, dtype=np.int64)
        self.buckets = np.asarray(buckets, dtype=np.int64)
        self.users = users
        self.folder = None if folder is None else Path(folder)
        self.in_driver = in_driver
        #: per-shard state of the methods' kernels, each under a key of its own
        self.state: dict[str, Any] = {}
        self._load_labels, self._load_embeddings, self._load_text = labels, embeddings, text
        self._labels: np.ndarray | None = None
        self._emb: np.ndarray | None = None
        self._text: TextShard | None = None

    @classmethod
    def of_arrays(cls, emb: np.ndarray, labels: np.ndarray, rows: np.ndarray,
                  buckets: np.ndarray, users: np.ndarray | None = None, index: int = 0,
                  shards: int = 1) -> Shard:
        """A shard over arrays already in memory (embeddings and label codes of ``rows``)."""
        emb, labels = np.asarray(emb), np.asarray(labels, dtype=np.int64)
        return cls(index, shards, rows=rows, buckets=buckets, users=users,
                   labels=lambda: labels, embeddings=lambda: emb)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def user_level(self) -> bool:
        """Whether the shard's statistics are bounded per user."""
        return self.users is not None

    @property
    def labels(self) -> np.ndarray:
        """Joint label code of every row (int64)."""
        if self._labels is None:
            self._labels = np.asarray(self._load_labels(), dtype=np.int64)
        return self._labels

    @property
    def emb(self) -> np.ndarray:
        """Embedding of every row (loaded, or computed, on first use)."""
        if self._emb is None:
            self._emb = self._load_embeddings()
        return self._emb

    @property
    def text(self) -> TextShard:
        """The rows' texts, label columns and users (read on first use)."""
        if self._text is None:
            self._text = self._load_text()
        return self._text

    def use_embeddings(self, load: Callable[[], np.ndarray]) -> None:
        """Read the embeddings from ``load`` from now on (a new embedder)."""
        self._load_embeddings, self._emb = load, None

    def private_file(self, stem: str, suffix: str) -> Path:
        """Where a kernel keeps its file ``stem`` of this shard: ``folder/stem+suffix`` for the
        driver's one shard, ``folder/stem-shard-S-of-N+suffix`` on a node."""
        if self.folder is None:
            raise RuntimeError("this shard has no private folder")
        name = stem if self.in_driver else f"{stem}-shard-{self.index}-of-{self.shards}"
        return self.folder / f"{name}{suffix}"
