"""The fingerprint of a data set's records: a digest of its texts, label columns and users,
read back in chunks (the same digest as a whole-file read), which the budget ledger keys
runs by (:mod:`dpsynth.identity`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np


def _prefixed(s: str) -> bytes:
    b = s.encode("utf-8")
    return len(b).to_bytes(8, "little") + b


class Fingerprint:
    """The streamed sha256 of :meth:`Dataset.fingerprint`: feed texts, then each label column,
    then the users, each in chunks, in record order."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._h.update(_prefixed("texts"))

    def strings(self, values: Iterable[str]) -> None:
        self._h.update(b"".join(_prefixed(v) for v in values))

    def coded(self, codes: np.ndarray, categories: Sequence[str]) -> None:
        pre = [_prefixed(c) for c in categories]
        self._h.update(b"".join(pre[c] for c in np.asarray(codes).tolist()))

    def section(self, name: str) -> None:
        self._h.update(_prefixed(name))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def fingerprint_columns(texts: Sequence[str], labels: Sequence[Sequence[str]],
                        label_columns: Sequence[str], users: Sequence[str] | None) -> str:
    """sha256 over the texts, labels (by column) and users, in order (length-prefixed)."""
    from ..columns import CodedColumn, chunks_of

    fp = Fingerprint()
    for chunk in chunks_of(texts):
        fp.strings(chunk)

    def put(column: Sequence[str]) -> None:
        if isinstance(column, CodedColumn):
            for start in range(0, len(column), 1 << 16):
                fp.coded(column.codes[start:start + (1 << 16)], column.categories)
        else:
            for chunk in chunks_of(column):
                fp.strings(chunk)

    for col, values in zip(label_columns, labels, strict=True):
        fp.section("label:" + col)
        put(values)
    if users is not None:
        fp.section("users")
        put(users)
    return fp.hexdigest()
