"""Columns of a loaded private data set that do not hold the records in Python memory.

* :class:`TextColumn`: the texts in an Arrow IPC file in a private folder (mode 0700, the file
  0600; removed when no column uses it any more), memory-mapped read-only. It is a
  ``Sequence[str]`` (len, index, slice, iteration) and reads in chunks
  (:meth:`TextColumn.chunks`), so 1M records never sit in memory as text.
  A :meth:`~TextColumn.take` view selects rows by index without copying text.
* :class:`CodedColumn`: a label or user column as integer codes (numpy) over its distinct values.

Both compare equal to a list of the same strings and never show a value in ``repr``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = ["CodedColumn", "TextColumn", "TextWriter", "chunks_of"]

CHUNK_ROWS = 8192
_SCHEMA = pa.schema([("text", pa.large_string())])


class _Store:
    """The private folder holding one loaded text column (made for it alone); removed with
    the last column that uses it, or at exit (the texts are still in the source file)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / "texts.arrow"
        weakref.finalize(self, shutil.rmtree, directory, True)


class _ListLike:
    """Compares equal to a list or tuple of the same values (and to its own kind); unhashable,
    like a list. ``repr`` is left to the subclass, which never shows a value."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type(self) | list | tuple):
            return len(self) == len(other) and all(  # type: ignore[arg-type]
                a == b for a, b in zip(self, other, strict=True))  # type: ignore[call-overload]
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class TextWriter:
    """Appends text chunks to a new Arrow IPC file; :meth:`finish` maps it as a column.

    The file goes into a new folder (mode 0700) inside ``directory`` (e.g. the run's private
    area), else in the system's temporary folder; either is removed when no column uses it."""

    def __init__(self, directory: str | Path | None = None) -> None:
        if directory is None:
            where = Path(tempfile.mkdtemp(prefix="dpsynth-texts-"))  # mode 0700
        else:
            Path(directory).mkdir(mode=0o700, parents=True, exist_ok=True)
            where = Path(tempfile.mkdtemp(prefix="texts-", dir=directory))
        self._store = _Store(where)
        os.close(os.open(self._store.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._sink = pa.OSFile(str(self._store.path), "wb")
        self._writer = ipc.new_file(self._sink, _SCHEMA)
        self.rows = 0

    def write(self, texts: Any) -> None:
        """Append a chunk (a pyarrow string array, a pandas string Series or a list)."""
        arr = texts if isinstance(texts, pa.Array | pa.ChunkedArray) else pa.array(
            texts, type=pa.large_string(), from_pandas=True)
        arr = arr.cast(pa.large_string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        self._writer.write_batch(pa.record_batch([arr], schema=_SCHEMA))
        self.rows += len(arr)

    def finish(self) -> TextColumn:
        """Close the file and return it memory-mapped as a column."""
        self._writer.close()
        self._sink.close()
        return TextColumn._open(self._store)


class TextColumn(_ListLike, Sequence[str]):
    """Texts on disk (memory-mapped Arrow), optionally through a row index; see the module."""

    def __init__(self, array: pa.ChunkedArray, index: np.ndarray | None = None,
                 store: _Store | None = None) -> None:
        self._array = array
        self._index = None if index is None else np.asarray(index, dtype=np.int64)
        self._store = store  # keeps a temporary folder alive while a column uses it

    @classmethod
    def _open(cls, store: _Store) -> TextColumn:
        source = pa.memory_map(str(store.path), "r")
        table = ipc.open_file(source).read_all()
        return cls(table.column(0), None, store)

    @classmethod
    def from_texts(cls, texts: Sequence[str] | Any,
                   directory: str | Path | None = None) -> TextColumn:
        """Write ``texts`` (any iterable of str) to a new private file and map it."""
        writer = TextWriter(directory)
        for chunk in chunks_of(texts, CHUNK_ROWS):
            writer.write(chunk)
        return writer.finish()

    def __len__(self) -> int:
        return len(self._array) if self._index is None else len(self._index)

    def _row(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("text index out of range")
        return i if self._index is None else int(self._index[i])

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step == 1:
                return self._slice(start, max(start, stop)).to_pylist()
            return self.take(np.arange(start, stop, step)).to_list()
        return self._array[self._row(int(i))].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in self.chunks():
            yield from chunk

    def chunks(self, size: int = CHUNK_ROWS) -> Iterator[list[str]]:
        """The texts in order, ``size`` at a time (only one chunk in memory at once)."""
        for start in range(0, len(self), size):
            yield self._slice(start, min(start + size, len(self))).to_pylist()

    def arrow_chunks(self, size: int = CHUNK_ROWS) -> Iterator[pa.Array]:
        """Like :meth:`chunks`, as pyarrow arrays (no Python strings)."""
        for start in range(0, len(self), size):
            yield self._slice(start, min(start + size, len(self)))

    def _slice(self, start: int, stop: int) -> pa.Array:
        if self._index is None:
            part = self._array.slice(start, stop - start)
        else:
            part = self._array.take(pa.array(self._index[start:stop]))
        return part.combine_chunks() if isinstance(part, pa.ChunkedArray) else part

    def take(self, indices: Sequence[int] | np.ndarray) -> TextColumn:
        """A view of the rows at ``indices`` (no text is copied)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError("text index out of range")
        idx = np.where(idx < 0, idx + len(self), idx)
        base = idx if self._index is None else self._index[idx]
        return TextColumn(self._array, base, self._store)

    def to_list(self) -> list[str]:
        """Every text as a list (loads them all into memory: small data only)."""
        return [t for chunk in self.chunks() for t in chunk]

    def __repr__(self) -> str:
        return "TextColumn(<private texts on disk>)"

    def __reduce__(self) -> Any:
        # a copy in another process maps the same file (it must stay where it is)
        if self._store is None:
            return (list, (self.to_list(),))
        return (_reopen, (str(self._store.path), self._index))


def _reopen(path: str, index: np.ndarray | None) -> TextColumn:
    table = ipc.open_file(pa.memory_map(path, "r")).read_all()
    return TextColumn(table.column(0), index)


class CodedColumn(_ListLike, Sequence[str]):
    """A string column as int32 codes into ``categories`` (each value once)."""

    def __init__(self, codes: np.ndarray, categories: Sequence[str]) -> None:
        self.codes = np.asarray(codes, dtype=np.int32)
        self.categories = list(categories)

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self.categories[c] for c in self.codes[i].tolist()]
        return self.categories[int(self.codes[int(i)])]

    def __iter__(self) -> Iterator[str]:
        cats = self.categories
        return (cats[c] for c in self.codes.tolist())

    def take(self, indices: Sequence[int] | np.ndarray) -> CodedColumn:
        return CodedColumn(self.codes[np.asarray(indices, dtype=np.int64)], self.categories)

    def values(self) -> np.ndarray:
        """The values as a numpy object array."""
        return np.asarray(self.categories, dtype=object)[self.codes] if len(self.categories) \
            else np.zeros(len(self), dtype=object)

    def codes_in(self, values: Sequence[str]) -> np.ndarray:
        """int64 index of every row's value in ``values`` (-1 where it is not among them)."""
        where = {v: i for i, v in enumerate(values)}
        lookup = np.array([where.get(c, -1) for c in self.categories] + [-1], dtype=np.int64)
        return lookup[self.codes]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.values()
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return "CodedColumn(<private values>)"


def chunks_of(values: Any, size: int = CHUNK_ROWS) -> Iterator[list[str]]:
    """``values`` in lists of ``size``: a :class:`TextColumn` reads its file chunk by chunk."""
    if isinstance(values, TextColumn):
        yield from values.chunks(size)
        return
    if isinstance(values, Sequence):
        for start in range(0, len(values), size):
            yield list(values[start:start + size])
        return
    chunk: list[str] = []
    for v in values:
        chunk.append(v)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
