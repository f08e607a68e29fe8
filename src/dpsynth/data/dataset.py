"""A loaded private data set (:class:`Dataset`): texts, label columns, users, the public label
domain and the joint label classes (their product, never derived from the records)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .fingerprint import fingerprint_columns
from .problems import DataProblem

MAX_JOINT_CLASSES = 100_000  # product of the declared label domains


def no_domain_message(columns: Sequence[str]) -> str:
    return (
        f"no public label domain for {', '.join(map(repr, columns))}: the label values are "
        "public input, never derived from the records; declare them in the config "
        "(data.label_values: {column: [value, ...]}) or pass label_values= to load_dataset"
    )


def check_label_values(
    label_values: Mapping[str, Sequence[str]], labels: Sequence[str]
) -> dict[str, list[str]]:
    """Validate a declared label domain (columns among ``labels``, distinct non-empty strings);
    returns it as lists. Raises ``ValueError`` naming the column."""
    out: dict[str, list[str]] = {}
    for col, values in label_values.items():
        if col not in labels:
            raise ValueError(
                f"label_values names {col!r}, which is not a label column {list(labels)}"
            )
        if isinstance(values, str):
            raise ValueError(f"label_values[{col!r}] must be a list of values, not a string")
        vals = list(values)
        if not vals:
            raise ValueError(f"label_values[{col!r}] is empty: declare at least one value")
        if not all(isinstance(v, str) and v.strip() for v in vals):
            raise ValueError(f"label_values[{col!r}]: every value must be a non-empty string")
        if len(set(vals)) != len(vals):
            raise ValueError(f"label_values[{col!r}] declares a value twice")
        out[col] = vals
    return out


@dataclass
class Dataset:
    """Validated records: texts, labels per column (as strings) and optional user ids.

    ``load_dataset`` gives a text column kept on disk (:class:`dpsynth.columns.TextColumn`)
    and coded label and user columns (:class:`dpsynth.columns.CodedColumn`); plain lists work
    too. ``label_domain`` is the public domain of each label column (declared in the config, or
    found privately by :mod:`dpsynth.label_domain`); ``None`` when none was given.
    """

    texts: Sequence[str]
    labels: dict[str, Sequence[str]]
    users: Sequence[str] | None
    source: str
    text_column: str
    label_columns: list[str]
    user_column: str | None
    warnings: list[DataProblem] = field(default_factory=list)
    label_domain: dict[str, list[str]] | None = None
    duplicates: int = 0  # rows repeating an earlier row (exact, private: diagnostics only)
    #: the resolved path of the file the records were read from (None: built in memory)
    path: str | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def content_digest(self) -> str:
        """sha256 of the bytes of the file the records came from: the source version the
        budget ledger knows it by (:mod:`dpsynth.identity`)."""
        from ..identity import file_digest

        if self.path is None:
            raise ValueError("this data set was not read from a file: it has no content digest")
        return file_digest(self.path)

    def text_sketch(self, key: bytes, normalised: bool = False) -> tuple[int, ...]:
        """The keyed bottom-k sketch of the texts, or of the normalised records
        (:func:`dpsynth.identity.text_sketch`)."""
        from ..identity import text_sketch

        return text_sketch(self.texts, key, normalised=normalised)

    def _domain(
        self, columns: Sequence[str], domain: Mapping[str, Sequence[str]] | None
    ) -> dict[str, list[str]]:
        """The public values of ``columns``: from ``domain`` or the one given at load time."""
        source = domain if domain is not None else (self.label_domain or {})
        missing = [c for c in columns if c not in source]
        if missing:
            raise ValueError(no_domain_message(missing))
        return check_label_values({c: source[c] for c in columns}, self.label_columns)

    def _codes_in(self, column: str, values: list[str]) -> np.ndarray:
        """Index of every record's value of ``column`` in ``values`` (-1 when absent)."""
        from ..columns import CodedColumn

        column_values = self.labels[column]
        if isinstance(column_values, CodedColumn):
            return column_values.codes_in(values)
        return pd.Categorical(list(column_values), categories=values).codes.astype(np.int64)

    def _column_codes(self, column: str, values: list[str]) -> np.ndarray:
        codes = self._codes_in(column, values)
        outside = np.flatnonzero(codes < 0)
        if outside.size:
            i = int(outside[0])
            raise ValueError(
                f"record {i + 1}: its {column} value ({len(str(self.labels[column][i]))} "
                f"characters) is not in "
                f"the declared domain of {column!r} ({len(values)} values)"
            )
        return codes

    def label_codes(
        self, column: str, values: Sequence[str] | None = None
    ) -> tuple[np.ndarray, list[str]]:
        """Integer codes of one label column over its public values (``values``, else the
        domain given at load time), and those values in declared order."""
        if column not in self.labels:
            raise KeyError(f"no label column {column!r}; label columns: {self.label_columns}")
        vals = self._domain([column], None if values is None else {column: values})[column]
        return self._column_codes(column, vals), vals

    def joint_label_codes(
        self, domain: Mapping[str, Sequence[str]] | None = None
    ) -> tuple[np.ndarray, list[tuple[str, ...]]]:
        """Codes over the joint classes: the Cartesian product of the public values of every
        label column, in declared order (the last column varies fastest), so a class that no
        record holds still exists. ``domain`` defaults to the one given at load time; one class
        ``()`` without label columns. Raises ``ValueError`` without a public domain."""
        if not self.label_columns:
            return np.zeros(len(self), dtype=np.int64), [()]
        dom = self._domain(self.label_columns, domain)
        sizes = [len(dom[c]) for c in self.label_columns]
        n_classes = math.prod(sizes)
        if n_classes > MAX_JOINT_CLASSES:
            raise ValueError(
                f"the declared label domains give {n_classes:,} joint classes "
                f"({' x '.join(map(str, sizes))}), over {MAX_JOINT_CLASSES:,}: use fewer label "
                "columns or values"
            )
        codes = np.zeros(len(self), dtype=np.int64)
        for col, size in zip(self.label_columns, sizes, strict=True):
            codes = codes * size + self._column_codes(col, dom[col])
        return codes, label_classes(self.label_columns, dom)

    def label_classes(self, domain: Mapping[str, Sequence[str]] | None = None
                      ) -> list[tuple[str, ...]]:
        """The joint classes of :meth:`joint_label_codes` (public: from the domain only)."""
        return label_classes(self.label_columns, self._domain(self.label_columns, domain)
                             if self.label_columns else {})

    def with_label_domain(self, domain: Mapping[str, Sequence[str]]) -> Dataset:
        """The records whose label values all lie in ``domain`` (e.g. a privately discovered
        one), carrying that domain. How many were dropped is private: never log it."""
        dom = check_label_values(domain, self.label_columns)
        keep = np.ones(len(self), dtype=bool)
        for col, vals in dom.items():
            keep &= self._codes_in(col, vals) >= 0
        out = self.subset(keep)
        out.label_domain = {**(self.label_domain or {}), **dom}
        return out

    def subset(self, indices: Sequence[int] | np.ndarray) -> Dataset:
        """The records at ``indices`` (ints, in the given order, or a boolean mask); a text
        column on disk is viewed through the indices, not copied."""
        idx = np.asarray(indices)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"boolean mask has shape {idx.shape}, expected ({len(self)},)")
            idx = np.flatnonzero(idx)
        idx = idx.reshape(-1).astype(np.int64)
        return Dataset(
            texts=take_rows(self.texts, idx),
            labels={c: take_rows(v, idx) for c, v in self.labels.items()},
            users=None if self.users is None else take_rows(self.users, idx),
            source=self.source,
            text_column=self.text_column,
            label_columns=list(self.label_columns),
            user_column=self.user_column,
            warnings=[],
            label_domain=None if self.label_domain is None else dict(self.label_domain),
            path=self.path,
        )

    def fingerprint(self) -> str:
        """sha256 over the texts, labels (by column) and users, in order (length-prefixed);
        read in chunks (:func:`fingerprint_columns`). The budget ledger knows the data by its
        source (:mod:`dpsynth.identity`), so dropping duplicates opens no new budget."""
        return fingerprint_columns(self.texts, [self.labels[c] for c in self.label_columns],
                                   self.label_columns, self.users)


def label_classes(columns: Sequence[str], domain: Mapping[str, Sequence[str]]
                  ) -> list[tuple[str, ...]]:
    """The Cartesian product of the public values of ``columns`` (last varies fastest)."""
    return list(itertools.product(*(domain[c] for c in columns)))


def take_rows(column: Sequence[str], idx: np.ndarray) -> Sequence[str]:
    """The values of ``column`` at the row numbers ``idx`` (a text column's own ``take``)."""
    take = getattr(column, "take", None)
    if take is not None and not isinstance(column, list | tuple):
        return take(idx)
    return [column[i] for i in idx.tolist()]
