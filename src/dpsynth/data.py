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

Private text never appears in a problem message beyond a short excerpt of at most 40
characters ending in an ellipsis (see :func:`excerpt`).

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

import hashlib
import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "CheckReport",
    "DataError",
    "DataProblem",
    "Dataset",
    "check_dataset",
    "check_label_values",
    "excerpt",
    "load_dataset",
    "read_jsonl",
    "write_jsonl",
]

SUPPORTED_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")
ON_DUPLICATE = ("warn", "error", "drop", "ignore")
MAX_LISTED = 20
EXCERPT_CHARS = 30  # plus quotes and an ellipsis: always <= 40 characters
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


class DataError(ValueError):
    """Invalid input data; ``problems`` lists every problem found (errors first)."""

    def __init__(self, problems: Sequence[DataProblem]):
        self.problems: list[DataProblem] = list(problems)
        n_err = sum(p.severity == "error" for p in self.problems)
        files = sorted({p.file for p in self.problems})
        where = files[0] if len(files) == 1 else ", ".join(files)
        head = f"{n_err} problem{'s' if n_err != 1 else ''} in {where}"
        super().__init__(head + ":\n" + _format_problems(self.problems))


def excerpt(text: str, n: int = EXCERPT_CHARS) -> str:
    """A quoted excerpt of at most ``n`` characters of ``text`` (<= 40 with quotes and '…')."""
    n = min(n, EXCERPT_CHARS)
    flat = " ".join(str(text).split())
    if len(flat) <= n:
        return repr(flat)
    return repr(flat[:n]) + "…"


def _no_domain_message(columns: Sequence[str]) -> str:
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

    ``label_domain`` is the public domain of each label column (declared in the config, or
    found privately by :mod:`dpsynth.label_domain`); ``None`` when none was given.
    """

    texts: list[str]
    labels: dict[str, list[str]]
    users: list[str] | None
    source: str
    text_column: str
    label_columns: list[str]
    user_column: str | None
    warnings: list[DataProblem] = field(default_factory=list)
    label_domain: dict[str, list[str]] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def _domain(
        self, columns: Sequence[str], domain: Mapping[str, Sequence[str]] | None
    ) -> dict[str, list[str]]:
        """The public values of ``columns``: from ``domain`` or the one given at load time."""
        source = domain if domain is not None else (self.label_domain or {})
        missing = [c for c in columns if c not in source]
        if missing:
            raise ValueError(_no_domain_message(missing))
        return check_label_values({c: source[c] for c in columns}, self.label_columns)

    def _column_codes(self, column: str, values: list[str]) -> np.ndarray:
        column_values = self.labels[column]
        codes = pd.Categorical(column_values, categories=values).codes.astype(np.int64)
        outside = np.flatnonzero(codes < 0)
        if outside.size:
            i = int(outside[0])
            raise ValueError(
                f"record {i + 1}: {column} value {excerpt(column_values[i])} is not in the "
                f"declared domain of {column!r} ({len(values)} values)"
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
        classes = list(itertools.product(*(dom[c] for c in self.label_columns)))
        return codes, classes

    def with_label_domain(self, domain: Mapping[str, Sequence[str]]) -> Dataset:
        """The records whose label values all lie in ``domain`` (e.g. a privately discovered
        one), carrying that domain. How many were dropped is private: never log it."""
        dom = check_label_values(domain, self.label_columns)
        keep = np.ones(len(self), dtype=bool)
        for col, vals in dom.items():
            allowed = set(vals)
            keep &= np.fromiter((v in allowed for v in self.labels[col]), dtype=bool,
                                count=len(self))
        out = self.subset(keep)
        out.label_domain = {**(self.label_domain or {}), **dom}
        return out

    def subset(self, indices: Sequence[int] | np.ndarray) -> Dataset:
        """The records at ``indices`` (ints, in the given order, or a boolean mask)."""
        idx = np.asarray(indices)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise ValueError(f"boolean mask has shape {idx.shape}, expected ({len(self)},)")
            idx = np.flatnonzero(idx)
        idx_list = [int(i) for i in idx.reshape(-1)]
        return Dataset(
            texts=[self.texts[i] for i in idx_list],
            labels={c: [v[i] for i in idx_list] for c, v in self.labels.items()},
            users=None if self.users is None else [self.users[i] for i in idx_list],
            source=self.source,
            text_column=self.text_column,
            label_columns=list(self.label_columns),
            user_column=self.user_column,
            warnings=[],
            label_domain=None if self.label_domain is None else dict(self.label_domain),
        )

    def fingerprint(self) -> str:
        """sha256 over the texts, labels (by column) and users, in order (length-prefixed)."""
        h = hashlib.sha256()

        def put(s: str) -> None:
            b = s.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)

        put("texts")
        for t in self.texts:
            put(t)
        for col in self.label_columns:
            put("label:" + col)
            for v in self.labels[col]:
                put(v)
        if self.users is not None:
            put("users")
            for u in self.users:
                put(u)
        return h.hexdigest()


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


@dataclass
class _Table:
    """Requested columns as pandas ``str`` Series (NA = missing) with their reported rows.

    Pandas' ``str`` dtype is Arrow-backed, so validation runs vectorised, not per value.
    """

    columns: dict[str, pd.Series]
    rows: np.ndarray  # reported row number of each record
    available: list[str]
    problems: list[DataProblem]  # reading problems (bad bytes, bad JSON, wrong types)


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


def _scan_utf8(path: Path, max_offsets: int = MAX_LISTED) -> tuple[list[tuple[int, int]], int]:
    """Byte offsets and 1-based file lines of undecodable bytes, and how many there are.

    Streams the file in binary chunks, so it never holds the whole file in memory.
    """
    found: list[tuple[int, int]] = []
    total = 0
    offset = 0  # absolute offset of ``carry``'s first byte
    newlines_before = 0
    carry = b""
    with path.open("rb") as fh:
        while True:
            chunk = fh.read(1 << 20)
            data = carry + chunk
            if not data:
                break
            carry = _incomplete_tail(data) if chunk else b""
            body = data[: len(data) - len(carry)]
            replaced = body.decode("utf-8", errors="replace")
            n_bad = replaced.count("\ufffd") - body.count(b"\xef\xbf\xbd")
            total += n_bad
            pos = 0
            while n_bad > 0 and len(found) < max_offsets and pos < len(body):
                try:
                    body[pos:].decode("utf-8")
                    break
                except UnicodeDecodeError as err:
                    bad = pos + err.start
                    line = newlines_before + body.count(b"\n", 0, bad) + 1
                    found.append((offset + bad, line))
                    pos = pos + err.end
            newlines_before += body.count(b"\n")
            offset += len(body)
            if not chunk:
                break
    return found, total


def _incomplete_tail(data: bytes) -> bytes:
    """The bytes at the end of ``data`` that may start a UTF-8 sequence cut by a chunk end."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0b1100_0000 == 0b1000_0000:  # continuation byte: look further back
            continue
        need = 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        return data[-back:] if need > back else b""
    return b""


def _read_csv(path: Path, name: str, wanted: Sequence[str], limit: int | None) -> _Table:
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
    available = [str(c) for c in header.columns]
    missing = _missing_columns(name, available, wanted)
    if missing:
        raise _FileError(missing)
    try:
        # All columns are parsed (no usecols): with usecols pandas silently drops the extra
        # fields of a ragged row, e.g. a text cut at an unquoted comma.
        df = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            na_filter=False,
            encoding="utf-8",
            encoding_errors="replace",
            nrows=limit,
        )
    except pd.errors.ParserError as err:
        raise _FileError(
            [DataProblem(name, None, None, f"cannot parse CSV: {_short(err)}")]
        ) from None
    if len(df) == 0:
        raise _FileError([DataProblem(name, None, None, "no data rows (header only)")])
    rows = np.arange(1, len(df) + 1)
    problems: list[DataProblem] = []
    bad_cells: list[tuple[int, str, int]] = []
    for col in dict.fromkeys(wanted):
        s = df[col]
        mask = s.str.contains("\ufffd", regex=False).to_numpy(dtype=bool)
        for i in np.flatnonzero(mask)[:_MAX_PER_KIND]:
            bad_cells.append((int(i), col, str(s.iat[int(i)]).count("\ufffd")))
    if bad_cells:
        offsets, total = _scan_utf8(path)
        if offsets:
            where = ", ".join(f"byte offset {o} (file line {ln})" for o, ln in offsets[:5])
            more = f" and {total - 5} more" if total > 5 else ""
            problems.append(
                DataProblem(
                    name, None, None, f"file is not valid UTF-8: undecodable bytes at {where}{more}"
                )
            )
        for i, col, k in sorted(bad_cells):
            if offsets:
                msg = f"not valid UTF-8 ({k} undecodable byte{'s' if k != 1 else ''})"
                problems.append(DataProblem(name, int(rows[i]), col, msg))
            else:  # valid UTF-8 holding U+FFFD: the text was damaged before it was saved
                msg = "contains U+FFFD replacement characters (damaged by an earlier decoding)"
                problems.append(DataProblem(name, int(rows[i]), col, msg, severity="warning"))
    columns = {c: df[c].astype("str") for c in dict.fromkeys(wanted)}
    return _Table(columns, rows, available, problems)


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


def _read_jsonl(path: Path, name: str, wanted: Sequence[str], limit: int | None) -> _Table:
    with path.open("rb") as fh:
        first = fh.read(1 << 16).removeprefix(b"\xef\xbb\xbf").lstrip()
    if not first:
        raise _FileError([DataProblem(name, None, None, "empty file (no records)")])
    if first.startswith(b"["):
        return _read_json_array(path, name, wanted, limit)
    cols = list(dict.fromkeys(wanted))
    values: dict[str, list[Any]] = {c: [] for c in cols}
    rows: list[int] = []
    available: dict[str, None] = {}
    problems: list[DataProblem] = []
    offset = 0
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line_start = offset
            offset += len(raw)
            if limit is not None and len(rows) >= limit:
                break
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                problems.append(
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
                problems.append(
                    DataProblem(name, lineno, None, f"invalid JSON: {err.msg} (column {err.colno})")
                )
                continue
            if not isinstance(obj, dict):
                problems.append(
                    DataProblem(
                        name, lineno, None, f"expected a JSON object, got {_json_type(obj)}"
                    )
                )
                continue
            for k in obj:
                available.setdefault(str(k), None)
            rows.append(lineno)
            for c in cols:
                values[c].append(obj.get(c))
    if not rows and not problems:
        raise _FileError([DataProblem(name, None, None, "empty file (no records)")])
    return _finish_records(
        name, cols, values, np.asarray(rows, dtype=np.int64), list(available), problems, wanted
    )


def _read_json_array(path: Path, name: str, wanted: Sequence[str], limit: int | None) -> _Table:
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
    cols = list(dict.fromkeys(wanted))
    values: dict[str, list[Any]] = {c: [] for c in cols}
    rows: list[int] = []
    available: dict[str, None] = {}
    problems: list[DataProblem] = []
    for i, obj in enumerate(data[:limit] if limit is not None else data, start=1):
        if not isinstance(obj, dict):
            problems.append(
                DataProblem(name, i, None, f"expected a JSON object, got {_json_type(obj)}")
            )
            continue
        for k in obj:
            available.setdefault(str(k), None)
        rows.append(i)
        for c in cols:
            values[c].append(obj.get(c))
    if not rows and not problems:
        raise _FileError([DataProblem(name, None, None, "empty file (no records)")])
    return _finish_records(
        name, cols, values, np.asarray(rows, dtype=np.int64), list(available), problems, wanted
    )


def _json_type(obj: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(obj), "a number"
    )


def _finish_records(
    name: str,
    cols: list[str],
    values: dict[str, list[Any]],
    rows: np.ndarray,
    available: list[str],
    problems: list[DataProblem],
    wanted: Sequence[str],
) -> _Table:
    if rows.size:
        missing = _missing_columns(name, available, wanted)
        if missing:
            raise _FileError(problems + missing)
    columns: dict[str, pd.Series] = {}
    for c in cols:
        columns[c], probs = _convert_column(name, c, values[c], rows, is_text=(c == wanted[0]))
        problems.extend(probs)
    return _Table(columns, rows, available, problems)


def _read_parquet(path: Path, name: str, wanted: Sequence[str], limit: int | None) -> _Table:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise _FileError(
            [DataProblem(name, None, None, f"cannot read Parquet: {_short(err)}")]
        ) from None
    available = list(pf.schema_arrow.names)
    missing = _missing_columns(name, available, wanted)
    if missing:
        raise _FileError(missing)
    if pf.metadata.num_rows == 0:
        raise _FileError([DataProblem(name, None, None, "empty file (no rows)")])
    cols = list(dict.fromkeys(wanted))
    if limit is None:
        table = pf.read(columns=cols)
    else:
        batches = []
        n = 0
        for batch in pf.iter_batches(columns=cols, batch_size=min(max(limit, 1), 65536)):
            batches.append(batch)
            n += batch.num_rows
            if n >= limit:
                break
        table = pa.Table.from_batches(batches, schema=batches[0].schema).slice(0, limit)
    rows = np.arange(1, table.num_rows + 1)
    columns: dict[str, pd.Series] = {}
    problems: list[DataProblem] = []
    for c in cols:
        col = table.column(c)
        is_text = c == wanted[0]
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            columns[c] = _arrow_strings(col)
            continue
        if not is_text and (pa.types.is_integer(col.type) or pa.types.is_boolean(col.type)):
            columns[c] = _arrow_strings(pc.cast(col, pa.string()))
            continue
        columns[c], probs = _convert_column(name, c, col.to_pylist(), rows, is_text=is_text)
        problems.extend(probs)
    return _Table(columns, rows, available, problems)


def _arrow_strings(col: Any) -> pd.Series:
    """A pyarrow string column as a pandas string Series, NA for nulls (no Python objects)."""
    return pd.Series(pd.array(col, dtype="str"))


def _read(path: Path, name: str, wanted: Sequence[str], limit: int | None) -> _Table:
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
        return _read_csv(path, name, wanted, limit)
    if suffix == ".parquet":
        return _read_parquet(path, name, wanted, limit)
    return _read_jsonl(path, name, wanted, limit)


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


def _cap(name: str, problems: list[DataProblem], kind: str) -> list[DataProblem]:
    if len(problems) <= _MAX_PER_KIND:
        return problems
    extra = len(problems) - _MAX_PER_KIND
    return problems[:_MAX_PER_KIND] + [
        DataProblem(name, None, None, f"... and {extra} more rows with {kind}")
    ]


def _validate(
    table: _Table,
    name: str,
    text: str,
    labels: Sequence[str],
    user: str | None,
    max_chars: int | None,
    on_duplicate: str,
    label_values: Mapping[str, list[str]] | None = None,
) -> tuple[list[DataProblem], list[DataProblem], np.ndarray]:
    """(errors, warnings, duplicate mask) for the table's records."""
    errors: list[DataProblem] = []
    warnings: list[DataProblem] = []
    n = len(table.rows)
    rows = table.rows
    if n == 0:
        errors.append(DataProblem(name, None, None, "no valid records"))
        return errors, warnings, np.zeros(0, dtype=bool)

    t = table.columns[text]
    t_missing = t.isna().to_numpy(dtype=bool)
    t_str = t.fillna("")
    blank = t_str.str.strip().eq("").to_numpy(dtype=bool)
    errs = []
    for i in np.flatnonzero(blank):
        what = "missing text" if t_missing[i] else "empty or whitespace-only text"
        errs.append(DataProblem(name, int(rows[i]), text, what))
    errors += _cap(name, errs, "empty text")
    if max_chars is not None:
        lengths = t_str.str.len().to_numpy()
        errs = [
            DataProblem(
                name,
                int(rows[i]),
                text,
                f"text has {int(lengths[i]):,} characters, over the limit of {max_chars:,} "
                f"(starts {excerpt(t_str.iat[int(i)])}); raise max_chars or shorten it",
            )
            for i in np.flatnonzero(lengths > max_chars)
        ]
        errors += _cap(name, errs, "over-long text")
    for col, kind in [*((c, "label") for c in labels), *([(user, "user id")] if user else [])]:
        s = table.columns[col]
        empty = (s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
        errs = [
            DataProblem(name, int(rows[i]), col, f"missing or empty {kind}")
            for i in np.flatnonzero(empty)
        ]
        errors += _cap(name, errs, f"missing {kind}")
    for col, values in (label_values or {}).items():
        s = table.columns[col]
        present = ~(s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
        outside = present & ~s.isin(values).to_numpy(dtype=bool)
        errs = [
            DataProblem(
                name,
                int(rows[i]),
                col,
                f"label value {excerpt(s.iat[int(i)])} is not among the {len(values)} declared "
                f"values of {col!r} (data.label_values)",
            )
            for i in np.flatnonzero(outside)
        ]
        errors += _cap(name, errs, f"undeclared {col!r} values")

    key_cols = [text, *labels]
    frame = pd.DataFrame({c: table.columns[c].fillna("") for c in dict.fromkeys(key_cols)})
    dup = frame.duplicated(keep="first").to_numpy(dtype=bool)
    if dup.any() and on_duplicate != "ignore":
        first_of = (
            frame.reset_index().groupby(list(frame.columns), sort=False)["index"].transform("min")
        )
        first_idx = first_of.to_numpy()
        what = "same text" + (" and labels" if labels else "")
        probs = [
            DataProblem(
                name,
                int(rows[i]),
                text,
                f"duplicate record ({what} as row {int(rows[first_idx[i]])})"
                + ("; dropped" if on_duplicate == "drop" else ""),
                severity="error" if on_duplicate == "error" else "warning",
            )
            for i in np.flatnonzero(dup)
        ]
        probs = _cap(name, probs, "duplicates")
        if on_duplicate == "error":
            errors += probs
        else:
            for p in probs:
                p.severity = "warning"
            warnings += probs
    return errors, warnings, dup


def _load(
    path: str | Path,
    text: str,
    labels: Sequence[str],
    user: str | None,
    max_chars: int | None,
    on_duplicate: str,
    limit: int | None,
    label_values: Mapping[str, list[str]] | None = None,
) -> tuple[_Table | None, list[DataProblem], list[DataProblem], np.ndarray]:
    p = Path(path)
    name = p.name
    if on_duplicate not in ON_DUPLICATE:
        raise ValueError(f"on_duplicate must be one of {ON_DUPLICATE}, got {on_duplicate!r}")
    if max_chars is not None and max_chars < 1:
        raise ValueError(f"max_chars must be >= 1 or None, got {max_chars}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    labels = list(labels)
    spec = _column_spec_problems(name, text, labels, user)
    if spec:
        return None, spec, [], np.zeros(0, dtype=bool)
    wanted = [text, *labels, *([user] if user else [])]
    try:
        table = _read(p, name, wanted, limit)
    except _FileError as err:
        return None, err.problems, [], np.zeros(0, dtype=bool)
    errors, warnings, dup = _validate(
        table, name, text, labels, user, max_chars, on_duplicate, label_values
    )
    # a cell that could not be read (bad bytes, wrong type) is reported once, not again as empty
    read_errors = [q for q in table.problems if q.severity == "error"]
    warnings = [q for q in table.problems if q.severity != "error"] + warnings
    unreadable = {(q.row, q.field) for q in read_errors if q.field is not None}
    errors = read_errors + [q for q in errors if (q.row, q.field) not in unreadable]
    errors.sort(key=lambda q: (q.row is not None, q.row or 0))
    return table, errors, warnings, dup


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
) -> Dataset:
    """Load and validate ``path`` (.csv, .jsonl/.json, .parquet, chosen by extension).

    ``label_values`` is the public label domain (column -> values, from the config's
    ``data.label_values``): a record with another value is an error naming its row, and the
    dataset carries the domain for :meth:`Dataset.joint_label_codes`.

    ``on_duplicate`` (same text and labels as an earlier row): ``"warn"`` keeps them and
    records a warning in ``dataset.warnings``; ``"drop"`` keeps the first only (with
    warnings); ``"error"`` makes them errors; ``"ignore"`` keeps them silently.
    ``limit`` reads only the first ``limit`` records. Raises :class:`DataError` listing every
    problem, and ``ValueError`` for invalid arguments.
    """
    if isinstance(labels, str):
        labels = [labels]
    domain = None if label_values is None else check_label_values(label_values, list(labels))
    table, errors, warnings, dup = _load(
        path, text, labels, user, max_chars, on_duplicate, limit, domain
    )
    if errors or table is None:
        raise DataError(errors)
    keep = ~dup if on_duplicate == "drop" else np.ones(len(table.rows), dtype=bool)
    cols = {c: s[keep].tolist() for c, s in table.columns.items()}
    return Dataset(
        texts=cols[text],
        labels={c: cols[c] for c in labels},
        users=cols[user] if user else None,
        source=Path(path).name,
        text_column=text,
        label_columns=list(labels),
        user_column=user,
        warnings=warnings,
        label_domain=domain,
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


def check_dataset(
    path: str | Path,
    text: str,
    labels: Sequence[str] = (),
    user: str | None = None,
    *,
    max_chars: int | None = 20000,
    label_values: Mapping[str, Sequence[str]] | None = None,
) -> CheckReport:
    """Validate ``path`` like :func:`load_dataset` but return every problem and a summary.

    ``summary``: ``file``, ``rows``, ``columns`` (all columns in the file), ``labels`` (per
    label column: class -> count, most frequent first), ``text_chars`` and ``text_words``
    (min / median / mean / max), ``users`` (distinct user ids, or None), ``duplicates``.
    With ``label_values``, values outside the declared domain are errors. Never raises on
    data problems.
    """
    if isinstance(labels, str):
        labels = [labels]
    labels = list(labels)
    domain = None if label_values is None else check_label_values(label_values, labels)
    table, errors, warnings, dup = _load(
        path, text, labels, user, max_chars, "warn", None, domain
    )
    summary: dict[str, Any] = {"file": str(path), "rows": 0, "columns": [], "labels": {}}
    if table is not None:
        t = table.columns[text].fillna("")
        summary["rows"] = len(table.rows)
        summary["columns"] = table.available
        for c in labels:
            counts = table.columns[c].fillna("").value_counts(sort=True)
            summary["labels"][c] = {str(k): int(v) for k, v in counts.items()}
        summary["text_chars"] = _stats(t.str.len().to_numpy(dtype=np.int64))
        summary["text_words"] = _stats(t.str.split().str.len().fillna(0).to_numpy(dtype=np.int64))
        summary["users"] = int(table.columns[user].dropna().nunique()) if user else None
        summary["duplicates"] = int(dup.sum())
    summary["errors"] = len(errors)
    summary["warnings"] = len(warnings)
    return CheckReport(problems=errors, warnings=warnings, summary=summary)


# ---------------------------------------------------------------------------- JSON Lines


def write_jsonl(
    path: str | Path, rows: Iterable[dict[str, Any]], *, mode: int | None = None
) -> int:
    """Write ``rows`` as JSON Lines atomically (temp file, fsync, rename); returns the count.

    A crash leaves either the old file or the complete new one. ``mode`` (e.g. ``0o600``)
    sets the file's permissions.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            for row in rows:
                if not isinstance(row, dict):
                    raise TypeError(f"row {n + 1}: expected a dict, got {type(row).__name__}")
                fh.write(json.dumps(row, ensure_ascii=False, default=_json_default))
                fh.write("\n")
                n += 1
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return n


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON Lines file of objects; raises :class:`DataError` naming each bad line."""
    path = Path(path)
    name = path.name
    if not path.is_file():
        raise DataError([DataProblem(name, None, None, f"file not found: {path}")])
    out: list[dict[str, Any]] = []
    problems: list[DataProblem] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                problems.append(
                    DataProblem(name, lineno, None, f"not valid UTF-8 (column {err.start + 1})")
                )
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                problems.append(
                    DataProblem(name, lineno, None, f"invalid JSON: {err.msg} (column {err.colno})")
                )
                continue
            if not isinstance(obj, dict):
                problems.append(
                    DataProblem(
                        name, lineno, None, f"expected a JSON object, got {_json_type(obj)}"
                    )
                )
                continue
            out.append(obj)
    if problems:
        raise DataError(problems)
    return out
