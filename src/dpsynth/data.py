"""Load private text data (CSV, JSON Lines, Parquet) and validate it with clear errors.

A private data set is one text column, zero or more label columns and, optionally, a user
column (the unit of privacy when one person wrote several records). :func:`load_dataset`
returns a :class:`Dataset` or raises :class:`DataError` listing *every* problem found (not
just the first); :func:`check_dataset` returns the same problems plus a summary without
raising, for ``dpsynth data check``.

Row numbers in problems are 1-based **data rows**:

- CSV and Parquet: row 1 is the first record after the header (the header is not counted).
  For a CSV file without multi-line fields, data row ``n`` sits on file line ``n + 1``.
- JSON Lines: the row is the **file line number** (blank lines are skipped but counted), so
  an editor's "go to line" finds it. A ``.json`` file holding one JSON array is accepted
  too; its rows are the 1-based array positions.

The file is streamed (:data:`CHUNK_ROWS` records at a time; only a ``.json`` array is parsed
whole): each chunk is validated and its texts appended to a private memory-mapped Arrow file
(:mod:`dpsynth.columns`), so the texts never sit in memory; labels and users are kept as int32
codes. Duplicates are found across chunks by a 64-bit hash of text and labels, confirmed by
comparing the records. :meth:`Dataset.fingerprint` reads the texts back in chunks and gives the
same digest as the whole-file loader did.

Private text never appears in a problem message: a message about a cell names the file, the
row, the field and the cell's length only.

The label domain is public input (docs/methods.md §0): ``label_values`` (from the config's
``data.label_values``) lists each label column's values, a record holding another value is an
error naming its row, and :meth:`Dataset.joint_label_codes` builds the classes as the product of
the declared values, so a declared class that no record holds still exists. Nothing about the
classes is derived from the records.

Values are read as strings: CSV cells are taken verbatim (``"NA"`` is a label, not a missing
value); in JSON and Parquet, numbers and booleans in label or user columns are converted to
strings (``4.0`` becomes ``"4"``), ``null``/NaN is a missing value.
"""

from __future__ import annotations

import codecs
import hashlib
import itertools
import json
import math
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import InputError

__all__ = [
    "CheckReport",
    "DataError",
    "DataProblem",
    "Dataset",
    "check_dataset",
    "check_label_values",
    "load_dataset",
]

SUPPORTED_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")
ON_DUPLICATE = ("warn", "error", "drop", "ignore")
MAX_LISTED = 20
_MAX_PER_KIND = 1000  # problems of one kind kept per file (the rest are counted)
MAX_JOINT_CLASSES = 100_000  # product of the declared label domains


@dataclass
class DataProblem:
    """One problem in a data file; ``row`` is a 1-based data row (see the module docstring)."""

    file: str
    row: int | None
    field: str | None
    message: str
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        parts = [self.file]
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts) + f": {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "file": self.file,
            "row": self.row,
            "field": self.field,
            "message": self.message,
            "severity": self.severity,
        }


def _format_problems(problems: Sequence[DataProblem], limit: int = MAX_LISTED) -> str:
    lines = [f"  - {p}" for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"  ... and {len(problems) - limit} more")
    return "\n".join(lines)


class DataError(InputError):
    """Invalid input data; ``problems`` lists every problem found (errors first)."""

    def __init__(self, problems: Sequence[DataProblem]):
        self.problems: list[DataProblem] = list(problems)
        n_err = sum(p.severity == "error" for p in self.problems)
        files = sorted({p.file for p in self.problems})
        where = files[0] if len(files) == 1 else ", ".join(files)
        head = f"{n_err} problem{'s' if n_err != 1 else ''} in {where}"
        super().__init__(head + ":\n" + _format_problems(self.problems))


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
        from .identity import file_digest

        if self.path is None:
            raise ValueError("this data set was not read from a file: it has no content digest")
        return file_digest(self.path)

    def text_sketch(self, key: bytes) -> tuple[int, ...]:
        """The keyed bottom-k sketch of the texts (:func:`dpsynth.identity.text_sketch`)."""
        from .identity import text_sketch

        return text_sketch(self.texts, key)

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
        from .columns import CodedColumn

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
    from .columns import CodedColumn, chunks_of

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


@dataclass
class CheckReport:
    """What :func:`check_dataset` found: errors, warnings and a summary."""

    problems: list[DataProblem]
    warnings: list[DataProblem]
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "summary": self.summary,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [p.to_dict() for p in self.warnings],
        }


# ----------------------------------------------------------------------------- reading

#: Records read, validated and written to the text file at a time.
CHUNK_ROWS = 16384


@dataclass
class _Table:
    """One chunk of requested columns as pandas ``str`` Series (NA = missing) with their
    reported rows and reading problems (bad bytes, bad JSON, wrong types).

    Pandas' ``str`` dtype is Arrow-backed, so validation runs vectorised, not per value.
    """

    columns: dict[str, pd.Series]
    rows: np.ndarray  # reported row number of each record
    problems: list[DataProblem] = field(default_factory=list)


@dataclass
class _FileInfo:
    """What a reader learns about the whole file: its columns and file-level problems found
    after the last chunk (e.g. where the undecodable bytes are)."""

    available: list[str] = field(default_factory=list)
    problems: list[DataProblem] = field(default_factory=list)


class _FileError(Exception):
    """A problem that stops reading the file."""

    def __init__(self, problems: list[DataProblem]):
        self.problems = problems


def _missing_columns(
    name: str, available: Sequence[str], wanted: Sequence[str]
) -> list[DataProblem]:
    missing = [c for c in wanted if c not in available]
    if not missing:
        return []
    shown = ", ".join(repr(c) for c in list(available)[:50])
    if len(available) > 50:
        shown += f", ... ({len(available)} columns)"
    return [
        DataProblem(name, None, c, f"column not found; available columns: {shown or '(none)'}")
        for c in missing
    ]


_SCAN = threading.local()  # undecodable spans found by the current thread's decode call


def _record_undecodable(err: UnicodeError) -> tuple[str, int]:
    """Codec error handler: note where an undecodable span starts, skip it."""
    assert isinstance(err, UnicodeDecodeError)
    _SCAN.starts.append(err.start)
    return "", err.end


codecs.register_error("dpsynth-record-undecodable", _record_undecodable)


def _scan_utf8(path: Path, max_offsets: int = MAX_LISTED) -> tuple[list[tuple[int, int]], int]:
    """Byte offsets and 1-based file lines of undecodable bytes, and how many there are.

    Streams the file in binary chunks through Python's incremental UTF-8 decoder (which holds
    back a character cut by a chunk end), so it never holds the whole file in memory.
    """
    found: list[tuple[int, int]] = []
    total = 0
    base = 0  # file offset of the decoder's held-back bytes (the start of ``data``)
    newlines = 0  # newlines in the file before ``base``
    decoder = codecs.getincrementaldecoder("utf-8")(errors="dpsynth-record-undecodable")
    with path.open("rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            data = decoder.getstate()[0] + chunk  # what the decoder sees in this call
            _SCAN.starts = []
            decoder.decode(chunk, final=not chunk)
            total += len(_SCAN.starts)
            line, seen = newlines + 1, 0  # starts ascend: count each newline once
            for start in _SCAN.starts[: max(0, max_offsets - len(found))]:
                line += data.count(b"\n", seen, start)
                seen = start
                found.append((base + start, line))
            consumed = len(data) - len(decoder.getstate()[0])
            newlines += data.count(b"\n", 0, consumed)
            base += consumed
            if not chunk:
                break
    return found, total


def _read_csv(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
              info: _FileInfo) -> Iterator[_Table]:
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8", encoding_errors="replace")
    except pd.errors.EmptyDataError:
        raise _FileError(
            [DataProblem(name, None, None, "empty file (0 bytes, no header)")]
        ) from None
    except pd.errors.ParserError as err:
        raise _FileError(
            [DataProblem(name, None, None, f"cannot parse CSV: {_short(err)}")]
        ) from None
    info.available = [str(c) for c in header.columns]
    missing = _missing_columns(name, info.available, wanted)
    if missing:
        raise _FileError(missing)
    cols = list(dict.fromkeys(wanted))
    bad_cells: list[tuple[int, str, int]] = []
    n_bad = dict.fromkeys(cols, 0)
    done = 0
    try:
        # All columns are parsed (no usecols): with usecols pandas silently drops the extra
        # fields of a ragged row, e.g. a text cut at an unquoted comma.
        with pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False,
                         encoding="utf-8", encoding_errors="replace", nrows=limit,
                         chunksize=size) as reader:
            for df in reader:
                rows = np.arange(done + 1, done + len(df) + 1)
                done += len(df)
                for col in cols:
                    s = df[col]
                    mask = s.str.contains("\ufffd", regex=False).to_numpy(dtype=bool)
                    for i in np.flatnonzero(mask)[: _MAX_PER_KIND - n_bad[col]]:
                        bad_cells.append((int(rows[i]), col, str(s.iat[int(i)]).count("\ufffd")))
                        n_bad[col] += 1
                yield _Table({c: df[c].astype("str") for c in cols}, rows)
    except pd.errors.ParserError as err:
        raise _FileError(
            [DataProblem(name, None, None, f"cannot parse CSV: {_short(err)}")]
        ) from None
    if done == 0:
        raise _FileError([DataProblem(name, None, None, "no data rows (header only)")])
    if bad_cells:
        info.problems += _utf8_problems(path, name, bad_cells)


def _utf8_problems(path: Path, name: str,
                   bad_cells: list[tuple[int, str, int]]) -> list[DataProblem]:
    """Problems for cells holding U+FFFD: undecodable bytes (errors, with their offsets) or,
    in a valid UTF-8 file, text damaged before it was saved (warnings)."""
    problems: list[DataProblem] = []
    offsets, total = _scan_utf8(path)
    if offsets:
        where = ", ".join(f"byte offset {o} (file line {ln})" for o, ln in offsets[:5])
        more = f" and {total - 5} more" if total > 5 else ""
        problems.append(
            DataProblem(
                name, None, None, f"file is not valid UTF-8: undecodable bytes at {where}{more}"
            )
        )
    for row, col, k in sorted(bad_cells):
        if offsets:
            msg = f"not valid UTF-8 ({k} undecodable byte{'s' if k != 1 else ''})"
            problems.append(DataProblem(name, row, col, msg))
        else:  # valid UTF-8 holding U+FFFD: the text was damaged before it was saved
            msg = "contains U+FFFD replacement characters (damaged by an earlier decoding)"
            problems.append(DataProblem(name, row, col, msg, severity="warning"))
    return problems


def _short(err: BaseException, n: int = 200) -> str:
    msg = " ".join(str(err).split())
    return msg if len(msg) <= n else msg[:n] + "…"


def _scalar_to_str(value: Any) -> tuple[str | None, str | None]:
    """(string value or None when missing, type problem or None) for a label or user cell."""
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, bool | np.bool_):
        return ("true" if value else "false"), None
    if isinstance(value, int | np.integer):
        return str(int(value)), None
    if isinstance(value, float | np.floating):
        f = float(value)
        if math.isnan(f):
            return None, None
        if f.is_integer():
            return str(int(f)), None
        return repr(f), None
    return None, f"expected a string or number, got {type(value).__name__}"


def _text_to_str(value: Any) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, str):
        return value, None
    if isinstance(value, float) and math.isnan(value):
        return None, None
    return None, f"expected a string, got {type(value).__name__}"


def _convert_column(
    name: str, col: str, values: Sequence[Any], rows: np.ndarray, is_text: bool
) -> tuple[pd.Series, list[DataProblem]]:
    conv = _text_to_str if is_text else _scalar_to_str
    out: list[str | None] = []
    problems: list[DataProblem] = []
    for i, v in enumerate(values):
        s, bad = conv(v)
        if bad is not None and len(problems) < _MAX_PER_KIND:
            problems.append(DataProblem(name, int(rows[i]), col, bad))
        out.append(s if bad is None else "")
    return pd.Series(out, dtype="str"), problems


class _Records:
    """Collects JSON objects into chunks of converted columns."""

    def __init__(self, name: str, wanted: Sequence[str], info: _FileInfo) -> None:
        self.name = name
        self.wanted = wanted
        self.cols = list(dict.fromkeys(wanted))
        self.info = info
        self.available: dict[str, None] = {}
        self.values: dict[str, list[Any]] = {c: [] for c in self.cols}
        self.rows: list[int] = []
        self.count = 0
        self.pending: list[DataProblem] = []  # reading problems of the coming chunk
        self.unreadable = 0

    def problem(self, problem: DataProblem) -> None:
        self.pending.append(problem)
        self.unreadable += 1

    def add(self, row: int, obj: Any) -> None:
        if not isinstance(obj, dict):
            self.problem(
                DataProblem(self.name, row, None, f"expected a JSON object, got {_json_type(obj)}")
            )
            return
        for k in obj:
            self.available.setdefault(str(k), None)
        self.rows.append(row)
        self.count += 1
        for c in self.cols:
            self.values[c].append(obj.get(c))

    def chunk(self) -> _Table:
        rows = np.asarray(self.rows, dtype=np.int64)
        columns: dict[str, pd.Series] = {}
        problems, self.pending = self.pending, []
        for c in self.cols:
            columns[c], probs = _convert_column(self.name, c, self.values[c], rows,
                                                is_text=(c == self.wanted[0]))
            problems.extend(probs)
            self.values[c] = []
        self.rows = []
        return _Table(columns, rows, problems)

    def end(self) -> Iterator[_Table]:
        """The last chunk; then the checks that need the whole file."""
        if self.rows or self.pending:
            yield self.chunk()
        self.info.available = list(self.available)
        if self.count:
            missing = _missing_columns(self.name, self.info.available, self.wanted)
            if missing:
                raise _FileError(missing)
        elif not self.unreadable:
            raise _FileError([DataProblem(self.name, None, None, "empty file (no records)")])


def _read_jsonl(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
                info: _FileInfo) -> Iterator[_Table]:
    with path.open("rb") as fh:
        first = fh.read(1 << 16).removeprefix(b"\xef\xbb\xbf").lstrip()
    if not first:
        raise _FileError([DataProblem(name, None, None, "empty file (no records)")])
    if first.startswith(b"["):
        yield from _read_json_array(path, name, wanted, limit, size, info)
        return
    rec = _Records(name, wanted, info)
    offset = 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line_start = offset
            offset += len(raw)
            if limit is not None and rec.count >= limit:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                rec.problem(
                    DataProblem(
                        name,
                        lineno,
                        None,
                        f"not valid UTF-8: byte 0x{raw[err.start]:02x} at byte offset "
                        f"{line_start + err.start} (column {err.start + 1} of the line)",
                    )
                )
                continue
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                rec.problem(
                    DataProblem(name, lineno, None, f"invalid JSON: {err.msg} (column {err.colno})")
                )
                continue
            rec.add(lineno, obj)
            if len(rec.rows) >= size:
                yield rec.chunk()
    yield from rec.end()


def _read_json_array(path: Path, name: str, wanted: Sequence[str], limit: int | None,
                     size: int, info: _FileInfo) -> Iterator[_Table]:
    """A ``.json`` file holding one array: parsed whole (the only format not streamed; use
    JSON Lines for large data), then validated in chunks."""
    try:
        with path.open("r", encoding="utf-8-sig") as fh:
            data = json.load(fh)
    except UnicodeDecodeError as err:
        raise _FileError(
            [DataProblem(name, None, None, f"not valid UTF-8 at byte offset {err.start}")]
        ) from None
    except json.JSONDecodeError as err:
        raise _FileError(
            [
                DataProblem(
                    name,
                    None,
                    None,
                    f"invalid JSON: {err.msg} (line {err.lineno}, column {err.colno})",
                )
            ]
        ) from None
    if not isinstance(data, list):
        raise _FileError([DataProblem(name, None, None, "expected a JSON array of objects")])
    rec = _Records(name, wanted, info)
    for i, obj in enumerate(data[:limit] if limit is not None else data, start=1):
        rec.add(i, obj)
        if len(rec.rows) >= size:
            yield rec.chunk()
    yield from rec.end()


def _json_type(obj: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(obj), "a number"
    )


def _read_parquet(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
                  info: _FileInfo) -> Iterator[_Table]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise _FileError(
            [DataProblem(name, None, None, f"cannot read Parquet: {_short(err)}")]
        ) from None
    info.available = list(pf.schema_arrow.names)
    missing = _missing_columns(name, info.available, wanted)
    if missing:
        raise _FileError(missing)
    if pf.metadata.num_rows == 0:
        raise _FileError([DataProblem(name, None, None, "empty file (no rows)")])
    cols = list(dict.fromkeys(wanted))
    done = 0
    batch_size = size if limit is None else min(size, max(limit, 1))
    for batch in pf.iter_batches(columns=cols, batch_size=batch_size):
        if limit is not None:
            batch = batch.slice(0, limit - done)
        rows = np.arange(done + 1, done + batch.num_rows + 1)
        done += batch.num_rows
        columns: dict[str, pd.Series] = {}
        problems: list[DataProblem] = []
        for c in cols:
            col = batch.column(c)
            is_text = c == wanted[0]
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                columns[c] = _arrow_strings(col)
                continue
            if not is_text and (pa.types.is_integer(col.type) or pa.types.is_boolean(col.type)):
                columns[c] = _arrow_strings(pc.cast(col, pa.string()))
                continue
            columns[c], probs = _convert_column(name, c, col.to_pylist(), rows, is_text=is_text)
            problems.extend(probs)
        yield _Table(columns, rows, problems)
        if limit is not None and done >= limit:
            break


def _arrow_strings(col: Any) -> pd.Series:
    """A pyarrow string column as a pandas string Series, NA for nulls (no Python objects)."""
    return pd.Series(pd.array(col, dtype="str"))


def _read(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
          info: _FileInfo) -> Iterator[_Table]:
    """The file's records in chunks of ``size`` (raises :class:`_FileError` when it cannot be
    read at all)."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise _FileError(
            [
                DataProblem(
                    name,
                    None,
                    None,
                    f"unsupported file type {suffix or '(no extension)'!r}; "
                    f"use one of {', '.join(SUPPORTED_SUFFIXES)}",
                )
            ]
        )
    if not path.exists():
        raise _FileError([DataProblem(name, None, None, f"file not found: {path}")])
    if path.is_dir():
        raise _FileError([DataProblem(name, None, None, f"is a directory, not a file: {path}")])
    if path.stat().st_size == 0:
        raise _FileError([DataProblem(name, None, None, "empty file (0 bytes)")])
    if suffix == ".csv":
        return _read_csv(path, name, wanted, limit, size, info)
    if suffix == ".parquet":
        return _read_parquet(path, name, wanted, limit, size, info)
    return _read_jsonl(path, name, wanted, limit, size, info)


# -------------------------------------------------------------------------- validation


def _column_spec_problems(
    name: str, text: str, labels: Sequence[str], user: str | None
) -> list[DataProblem]:
    problems = []
    seen: dict[str, str] = {text: "text"}
    for col in labels:
        if col in seen:
            problems.append(
                DataProblem(name, None, col, f"column given twice (as {seen[col]} and as label)")
            )
        seen[col] = "label"
    if user is not None and user in seen:
        problems.append(
            DataProblem(name, None, user, f"column given twice (as {seen[user]} and as user)")
        )
    return problems


class _Kinds:
    """Problems by kind, at most ``_MAX_PER_KIND`` kept per kind (the rest are counted)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kept: dict[str, list[DataProblem]] = {}
        self.extra: dict[str, int] = {}

    def add(self, kind: str, problems: Iterable[DataProblem]) -> None:
        kept = self.kept.setdefault(kind, [])
        for p in problems:
            if len(kept) < _MAX_PER_KIND:
                kept.append(p)
            else:
                self.extra[kind] = self.extra.get(kind, 0) + 1

    def room(self, kind: str) -> int:
        """How many more problems of ``kind`` are kept (0: only count them)."""
        return _MAX_PER_KIND - len(self.kept.get(kind, []))

    def all(self) -> list[DataProblem]:
        out: list[DataProblem] = []
        for kind, kept in self.kept.items():
            out += kept
            if self.extra.get(kind):
                out.append(DataProblem(self.name, None, None,
                                       f"... and {self.extra[kind]} more rows with {kind}"))
        return out


class _Collector:
    """Validates the chunks as they come, writes the texts to a private memory-mapped file
    and codes the label and user columns (see :func:`load_dataset`)."""

    def __init__(self, name: str, text: str, labels: Sequence[str], user: str | None,
                 max_chars: int | None, label_values: Mapping[str, list[str]] | None,
                 text_dir: str | Path | None, words: bool, within_user: bool = False) -> None:
        from .columns import TextWriter

        self.name, self.text, self.labels, self.user = name, text, list(labels), user
        # duplicates: same text and labels (and, with ``within_user``, the same user id)
        self.dup_columns = [*self.labels, *([user] if within_user and user else [])]
        self.max_chars = max_chars
        self.label_values = label_values or {}
        self.errors = _Kinds(name)
        self.read_problems: list[DataProblem] = []
        self.writer = TextWriter(text_dir)
        self.coded = [*self.labels, *([user] if user else [])]
        self.codes: dict[str, list[np.ndarray]] = {c: [] for c in self.coded}
        self.values: dict[str, dict[str, int]] = {c: {} for c in self.coded}
        self.rows: list[np.ndarray] = []
        self.hashes: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.words: list[np.ndarray] | None = [] if words else None

    def add(self, table: _Table) -> None:
        self.read_problems += table.problems
        n = len(table.rows)
        if n == 0:
            return
        rows = table.rows
        self.rows.append(np.asarray(rows, dtype=np.int64))
        name, text = self.name, self.text
        t = table.columns[text]
        t_missing = t.isna().to_numpy(dtype=bool)
        t_str = t.fillna("")
        self.writer.write(t_str)
        blank = t_str.str.strip().eq("").to_numpy(dtype=bool)
        self.errors.add("empty text", (
            DataProblem(name, int(rows[i]), text,
                        "missing text" if t_missing[i] else "empty or whitespace-only text")
            for i in np.flatnonzero(blank)))
        lengths = t_str.str.len().to_numpy(dtype=np.int64)
        self.lengths.append(lengths)
        if self.words is not None:
            self.words.append(
                t_str.str.split().str.len().fillna(0).to_numpy(dtype=np.int64))
        if self.max_chars is not None:
            mc = self.max_chars
            self.errors.add("over-long text", (
                DataProblem(
                    name,
                    int(rows[i]),
                    text,
                    f"text has {int(lengths[i]):,} characters, over the limit of {mc:,}; raise "
                    "data.max_chars or shorten it",
                )
                for i in np.flatnonzero(lengths > mc)))
        kinds = [*((c, "label") for c in self.labels), *([(self.user, "user id")]
                                                          if self.user else [])]
        for col, kind in kinds:
            s = table.columns[col]
            empty = (s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
            self.errors.add(f"missing {kind}", (
                DataProblem(name, int(rows[i]), col, f"missing or empty {kind}")
                for i in np.flatnonzero(empty)))
        for col, values in self.label_values.items():
            s = table.columns[col]
            present = ~(s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
            outside = present & ~s.isin(values).to_numpy(dtype=bool)
            self.errors.add(f"undeclared {col!r} values", (
                DataProblem(
                    name,
                    int(rows[i]),
                    col,
                    f"label value ({len(str(s.iat[int(i)]))} characters) is not among the "
                    f"{len(values)} "
                    f"declared values of {col!r} (data.label_values)",
                )
                for i in np.flatnonzero(outside)))
        for col in self.coded:
            codes, uniques = pd.factorize(table.columns[col])
            seen = self.values[col]
            remap = np.array([seen.setdefault(str(u), len(seen)) for u in uniques] + [-1],
                             dtype=np.int32)
            self.codes[col].append(remap[codes])
        key_cols = list(dict.fromkeys([text, *self.dup_columns]))
        frame = pd.DataFrame({c: table.columns[c].fillna("") for c in key_cols})
        self.hashes.append(pd.util.hash_pandas_object(frame, index=False).to_numpy(np.uint64))

    def finish(self, on_duplicate: str) -> tuple[Any, list[DataProblem], list[DataProblem],
                                                  np.ndarray]:
        """(text column, errors, warnings, duplicate mask) of the whole file."""
        texts = self.writer.finish()
        n = len(texts)
        warnings: list[DataProblem] = []
        if n == 0:
            self.errors.add("no records", [DataProblem(self.name, None, None,
                                                       "no valid records")])
            return texts, self.errors.all(), warnings, np.zeros(0, dtype=bool)
        rows = np.concatenate(self.rows)
        dup, first = self._duplicates(texts)
        if dup.any() and on_duplicate != "ignore":
            what = "same text" + (" and labels" if self.labels else "") + (
                " and user" if self.user in self.dup_columns else "")
            kinds = _Kinds(self.name)
            kinds.add("duplicates", (
                DataProblem(
                    self.name,
                    int(rows[i]),
                    self.text,
                    f"duplicate record ({what} as row {int(rows[first[i]])})"
                    + ("; dropped" if on_duplicate == "drop" else ""),
                    severity="error" if on_duplicate == "error" else "warning",
                )
                for i in np.flatnonzero(dup)))
            if on_duplicate == "error":
                self.errors.add("duplicates", kinds.all())
            else:
                warnings += kinds.all()
        return texts, self.errors.all(), warnings, dup

    def column_codes(self, col: str) -> tuple[np.ndarray, list[str]]:
        """(codes, values in first-seen order) of a label or user column."""
        codes = np.concatenate(self.codes[col]) if self.codes[col] else np.zeros(0, np.int32)
        return codes, list(self.values[col])

    def _duplicates(self, texts: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mask of rows repeating an earlier row's text and labels, that earlier row).

        Rows are matched by a 64-bit hash, then compared exactly (a collision is not a
        duplicate)."""
        h = np.concatenate(self.hashes)
        n = len(h)
        _, first_idx, inverse = np.unique(h, return_index=True, return_inverse=True)
        first = first_idx[inverse.reshape(-1)]
        dup = first != np.arange(n)
        label_codes = [self.column_codes(c)[0] for c in self.dup_columns]
        for i in np.flatnonzero(dup).tolist():
            f = int(first[i])
            if texts[i] != texts[f] or any(c[i] != c[f] for c in label_codes):
                dup[i] = False
        return dup, first


def _load(
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
) -> tuple[_Collector | None, Any, list[DataProblem], list[DataProblem], np.ndarray,
           _FileInfo]:
    p = Path(path)
    name = p.name
    info = _FileInfo()
    if on_duplicate not in ON_DUPLICATE:
        raise ValueError(f"on_duplicate must be one of {ON_DUPLICATE}, got {on_duplicate!r}")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1 or None, got {max_chars}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    labels = list(labels)
    none = np.zeros(0, dtype=bool)
    spec = _column_spec_problems(name, text, labels, user)
    if spec:
        return None, None, spec, [], none, info
    wanted = [text, *labels, *([user] if user else [])]
    collector = _Collector(name, text, labels, user, max_chars, label_values, text_dir, words,
                           within_user)
    try:
        for table in _read(p, name, wanted, limit, chunk_rows or CHUNK_ROWS, info):
            collector.add(table)
    except _FileError as err:
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
    from .columns import CodedColumn

    if isinstance(labels, str):
        labels = [labels]
    domain = None if label_values is None else check_label_values(label_values, list(labels))
    collector, texts, errors, warnings, dup, _ = _load(
        path, text, labels, user, max_chars, on_duplicate, limit, domain, text_dir,
        chunk_rows=chunk_rows, within_user=duplicates_within_user)
    if errors or collector is None:
        raise DataError(errors)
    keep = np.flatnonzero(~dup) if on_duplicate == "drop" and dup.any() else None

    def coded(col: str) -> CodedColumn:
        codes, values = collector.column_codes(col)
        return CodedColumn(codes if keep is None else codes[keep], values)

    return Dataset(
        texts=texts if keep is None else texts.take(keep),
        labels={c: coded(c) for c in labels},
        users=coded(user) if user else None,
        source=Path(path).name,
        text_column=text,
        label_columns=list(labels),
        user_column=user,
        warnings=warnings,
        label_domain=domain,
        duplicates=int(dup.sum()) if on_duplicate != "ignore" else 0,
        path=str(Path(path).resolve()),
    )


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "median": 0.0, "mean": 0.0, "max": 0}
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "mean": round(float(values.mean()), 2),
        "max": int(values.max()),
    }


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_dataset(
    path: str | Path,
    text: str,
    labels: Sequence[str] = (),
    user: str | None = None,
    *,
    max_chars: int | None = 20000,
    label_values: Mapping[str, Sequence[str]] | None = None,
    chunk_rows: int | None = None,
) -> CheckReport:
    """Validate ``path`` like :func:`load_dataset` but return every problem and a summary.

    ``summary``: ``file``, ``rows``, ``columns`` (all columns in the file), ``labels`` (per
    label column: class -> count, most frequent first), ``text_chars`` and ``text_words``
    (min / median / mean / max), ``users`` (distinct user ids, or None), ``duplicates``.
    With ``label_values``, values outside the declared domain are errors. Never raises on
    data problems; reads the file in chunks like :func:`load_dataset`.
    """
    if isinstance(labels, str):
        labels = [labels]
    labels = list(labels)
    domain = None if label_values is None else check_label_values(label_values, labels)
    collector, texts, errors, warnings, dup, info = _load(
        path, text, labels, user, max_chars, "warn", None, domain, words=True,
        chunk_rows=chunk_rows)
    summary: dict[str, Any] = {"file": str(path), "rows": 0, "columns": [], "labels": {}}
    if collector is not None:
        summary["rows"] = len(texts)
        summary["columns"] = info.available
        for c in labels:
            codes, values = collector.column_codes(c)
            counts = np.bincount(codes[codes >= 0], minlength=len(values))
            order = np.argsort(-counts, kind="stable")
            summary["labels"][c] = {values[i]: int(counts[i]) for i in order if counts[i]}
        summary["text_chars"] = _stats(_concat(collector.lengths))
        summary["text_words"] = _stats(_concat(collector.words or []))
        if user:
            codes, _ = collector.column_codes(user)
            summary["users"] = int(np.unique(codes[codes >= 0]).size)
        else:
            summary["users"] = None
        summary["duplicates"] = int(dup.sum())
    summary["errors"] = len(errors)
    summary["warnings"] = len(warnings)
    return CheckReport(problems=errors, warnings=warnings, summary=summary)


# ---------------------------------------------------------------------------- JSON Lines
