"""Loading a private data file: read (:mod:`.readers`), validate (:mod:`.validation`) and
return a :class:`~dpsynth.data.dataset.Dataset`, or raise :class:`DataError` listing every
problem."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import readers
from .dataset import Dataset, check_label_values
from .problems import DataError, DataProblem
from .readers import CHUNK_ROWS, FileError, FileInfo
from .validation import Collector, column_spec_problems

ON_DUPLICATE = ("warn", "error", "drop", "ignore")


def read_validated(
    path: str | Path,
    text: str,
    labels: Sequence[str],
    user: str | None,
    max_chars: int | None,
    on_duplicate: str,
    limit: int | None,
    label_values: Mapping[str, list[str]] | None = None,
    text_dir: str | Path | None = None,
    words: bool = False,
    chunk_rows: int | None = None,
    within_user: bool = False,
) -> tuple[Collector | None, Any, list[DataProblem], list[DataProblem], np.ndarray,
           FileInfo]:
    p = Path(path)
    name = p.name
    info = FileInfo()
    if on_duplicate not in ON_DUPLICATE:
        raise ValueError(f"on_duplicate must be one of {ON_DUPLICATE}, got {on_duplicate!r}")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1 or None, got {max_chars}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    labels = list(labels)
    none = np.zeros(0, dtype=bool)
    spec = column_spec_problems(name, text, labels, user)
    if spec:
        return None, None, spec, [], none, info
    wanted = [text, *labels, *([user] if user else [])]
    collector = Collector(name, text, labels, user, max_chars, label_values, text_dir, words,
                           within_user)
    try:
        for table in readers.read_chunks(p, name, wanted, limit, chunk_rows or CHUNK_ROWS, info):
            collector.add(table)
    except FileError as err:
        collector.writer.finish()
        return None, None, collector.read_problems + err.problems, [], none, info
    texts, errors, warnings, dup = collector.finish(on_duplicate)
    # a cell that could not be read (bad bytes, wrong type) is reported once, not again as empty
    reading = collector.read_problems + info.problems
    read_errors = [q for q in reading if q.severity == "error"]
    warnings = [q for q in reading if q.severity != "error"] + warnings
    unreadable = {(q.row, q.field) for q in read_errors if q.field is not None}
    errors = read_errors + [q for q in errors if (q.row, q.field) not in unreadable]
    errors.sort(key=lambda q: (q.row is not None, q.row or 0))
    return collector, texts, errors, warnings, dup, info


def load_dataset(
    path: str | Path,
    text: str,
    labels: Sequence[str] = (),
    user: str | None = None,
    *,
    max_chars: int | None = 20000,
    on_duplicate: str = "warn",
    limit: int | None = None,
    label_values: Mapping[str, Sequence[str]] | None = None,
    text_dir: str | Path | None = None,
    chunk_rows: int | None = None,
    duplicates_within_user: bool = False,
) -> Dataset:
    """Load and validate ``path`` (.csv, .jsonl/.json, .parquet, chosen by extension).

    The file is read ``chunk_rows`` records at a time (default :data:`CHUNK_ROWS`; a ``.json``
    array is parsed whole, so use JSON Lines for large data) and each chunk is validated and
    its texts appended to an Arrow file in a new private folder (mode 0700, file 0600) inside
    ``text_dir`` (e.g. the run's private area), else in the system's temporary folder; the
    folder is removed when the dataset (and every subset of it) is no longer used.
    ``dataset.texts`` is that file memory-mapped (:class:`dpsynth.columns.TextColumn`);
    labels and users are integer codes (:class:`dpsynth.columns.CodedColumn`), so the
    records never sit in memory as text.

    ``label_values`` is the public label domain (column -> values, from the config's
    ``data.label_values``): a record with another value is an error naming its row, and the
    dataset carries the domain for :meth:`Dataset.joint_label_codes`.

    ``on_duplicate`` (same text and labels as an earlier row): ``"warn"`` keeps them and
    records a warning in ``dataset.warnings``; ``"drop"`` keeps the first only (with
    warnings); ``"error"`` makes them errors; ``"ignore"`` keeps them silently. With
    ``duplicates_within_user`` (and a ``user`` column) a duplicate must also have the same
    user id: dropping it then changes only that user's own records, so user-level
    neighbours stay neighbours. ``dataset.duplicates`` counts the rows found (kept or
    dropped).
    ``limit`` reads only the first ``limit`` records. Raises :class:`DataError` listing every
    problem, and ``ValueError`` for invalid arguments.
    """
    if isinstance(labels, str):
        labels = [labels]
    domain = None if label_values is None else check_label_values(label_values, list(labels))
    collector, texts, errors, warnings, dup, _ = read_validated(
        path, text, labels, user, max_chars, on_duplicate, limit, domain, text_dir,
        chunk_rows=chunk_rows, within_user=duplicates_within_user)
    if errors or collector is None:
        raise DataError(errors)
    keep = np.flatnonzero(~dup) if on_duplicate == "drop" and dup.any() else None
    return Dataset(
        texts=texts if keep is None else texts.take(keep),
        labels={c: _coded(collector, c, keep) for c in labels},
        users=_coded(collector, user, keep) if user else None,
        source=Path(path).name, text_column=text, label_columns=list(labels), user_column=user,
        warnings=warnings, label_domain=domain,
        duplicates=int(dup.sum()) if on_duplicate != "ignore" else 0,
        path=str(Path(path).resolve()),
    )


def _coded(collector: Collector, col: str, keep: np.ndarray | None) -> Any:
    """The integer-coded column ``col`` of the kept records (``keep``: None, all of them)."""
    from ..columns import CodedColumn

    codes, values = collector.column_codes(col)
    return CodedColumn(codes if keep is None else codes[keep], values)
