"""The private data set of a ``compute.engine: ray`` run, as the driver sees it.

The driver never reads the private file: the Ray shard actors (:mod:`.ray_engine`) each read
and validate the whole file, fingerprint it and keep their user buckets; the driver checks
that they agree and holds only what they report: the fingerprint, the number of records
(private: never log it), the file's warnings, and the public label domain. Every statistic of
the records comes through :attr:`ShardedDataset.compute` as partial sums. Per-record fields
(``texts``, ``labels``, ``users``, label codes, ``subset``) raise :class:`ShardedDataError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ..errors import ComputeError

__all__ = ["ShardedDataError", "ShardedDataset"]


class ShardedDataError(ComputeError, AttributeError):
    """A per-record field of a data set that lives on the Ray shards."""


def _refuse(what: str) -> NoReturn:
    raise ShardedDataError(
        f"{what} is per-record private data, held by the Ray shards (compute.engine: ray); "
        "the driver only receives partial statistics: use ShardedDataset.compute "
        "(its map of shard kernels, label_value_counts, the vote histograms)")


class ShardedDataset:
    """The :class:`dpsynth.data.Dataset` interface minus per-record fields, over shards."""

    def __init__(self, compute: Any, source: str, text_column: str,
                 label_columns: Sequence[str], user_column: str | None,
                 label_domain: Mapping[str, Sequence[str]] | None) -> None:
        from ..data import DataProblem

        self.compute = compute
        self.source = source
        self.text_column = text_column
        self.label_columns = list(label_columns)
        self.user_column = user_column
        self.label_domain = None if label_domain is None else {
            c: list(v) for c, v in label_domain.items()}
        self.warnings = [DataProblem(**w) for w in compute.warnings]

    def __len__(self) -> int:
        return int(self.compute.n)

    def fingerprint(self) -> str:
        """The fingerprint every shard computed (the same digest as a local load)."""
        return str(self.compute.fingerprint)

    def content_digest(self) -> str:
        """sha256 of the private file's bytes, as every shard read it (its ledger version)."""
        return str(self.compute.content)

    def text_sketch(self, key: bytes, normalised: bool = False) -> tuple[int, ...]:
        """The keyed sketch of the texts (or normalised records), computed on a shard
        (:mod:`dpsynth.identity`)."""
        return self.compute.text_sketch(key, normalised)

    def with_label_domain(self, domain: Mapping[str, Sequence[str]]) -> ShardedDataset:
        """Keep, on the shards, the records whose labels lie in ``domain`` (this view and the
        returned one share the shards, so both then see only those records)."""
        from ..data import check_label_values

        dom = check_label_values(domain, self.label_columns)
        full = {**(self.label_domain or {}), **dom}
        self.compute.set_domain(full)
        return ShardedDataset(self.compute, self.source, self.text_column, self.label_columns,
                              self.user_column, full)

    def label_classes(self, domain: Mapping[str, Sequence[str]] | None = None
                      ) -> list[tuple[str, ...]]:
        """The joint classes (public: the product of the label domain's values)."""
        from ..data import label_classes, no_domain_message

        dom = domain if domain is not None else (self.label_domain or {})
        missing = [c for c in self.label_columns if c not in dom]
        if missing:
            raise ValueError(no_domain_message(missing))
        return label_classes(self.label_columns, dom)

    def label_value_counts(self, columns: Sequence[str], max_values_per_user: int = 1
                           ) -> dict[str, tuple[list[str], np.ndarray]]:
        """Summed exact counts of the values present per label column (discovery)."""
        return self.compute.label_value_counts(columns, max_values_per_user)

    @property
    def texts(self) -> NoReturn:
        _refuse("dataset.texts")

    @property
    def labels(self) -> NoReturn:
        _refuse("dataset.labels")

    @property
    def users(self) -> NoReturn:
        _refuse("dataset.users")

    def label_codes(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("dataset.label_codes()")

    def joint_label_codes(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("dataset.joint_label_codes()")

    def subset(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse("dataset.subset()")

    def __repr__(self) -> str:
        return f"ShardedDataset(source={self.source!r}, shards={self.compute.shards})"
