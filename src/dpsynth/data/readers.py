"""The readers of a private data file (CSV, JSON Lines or one JSON array, Parquet, chosen by
extension): its records in chunks of the requested columns as pandas ``str`` Series, with
the reading problems (undecodable bytes, bad JSON, wrong types) of each chunk."""

from __future__ import annotations

import codecs
import json
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .problems import MAX_LISTED, MAX_PER_KIND, DataProblem

SUPPORTED_SUFFIXES = (".csv", ".jsonl", ".json", ".parquet")


#: Records read, validated and written to the text file at a time.
CHUNK_ROWS = 16384


@dataclass
class Table:
    """One chunk of requested columns as pandas ``str`` Series (NA = missing) with their
    reported rows and reading problems (bad bytes, bad JSON, wrong types).

    Pandas' ``str`` dtype is Arrow-backed, so validation runs vectorised, not per value.
    """

    columns: dict[str, pd.Series]
    rows: np.ndarray  # reported row number of each record
    problems: list[DataProblem] = field(default_factory=list)


@dataclass
class FileInfo:
    """What a reader learns about the whole file: its columns and file-level problems found
    after the last chunk (e.g. where the undecodable bytes are)."""

    available: list[str] = field(default_factory=list)
    problems: list[DataProblem] = field(default_factory=list)


class FileError(Exception):
    """A problem that stops reading the file."""

    def __init__(self, problems: list[DataProblem]):
        self.problems = problems


def missing_columns(
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


def scan_utf8(path: Path, max_offsets: int = MAX_LISTED) -> tuple[list[tuple[int, int]], int]:
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
              info: FileInfo) -> Iterator[Table]:
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8", encoding_errors="replace")
    except pd.errors.EmptyDataError:
        raise FileError(
            [DataProblem(name, None, None, "empty file (0 bytes, no header)")]
        ) from None
    except pd.errors.ParserError as err:
        raise FileError(
            [DataProblem(name, None, None, f"cannot parse CSV: {_short(err)}")]
        ) from None
    info.available = [str(c) for c in header.columns]
    missing = missing_columns(name, info.available, wanted)
    if missing:
        raise FileError(missing)
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
                    for i in np.flatnonzero(mask)[: MAX_PER_KIND - n_bad[col]]:
                        bad_cells.append((int(rows[i]), col, str(s.iat[int(i)]).count("\ufffd")))
                        n_bad[col] += 1
                yield Table({c: df[c].astype("str") for c in cols}, rows)
    except pd.errors.ParserError as err:
        raise FileError(
            [DataProblem(name, None, None, f"cannot parse CSV: {_short(err)}")]
        ) from None
    if done == 0:
        raise FileError([DataProblem(name, None, None, "no data rows (header only)")])
    if bad_cells:
        info.problems += _utf8_problems(path, name, bad_cells)


def _utf8_problems(path: Path, name: str,
                   bad_cells: list[tuple[int, str, int]]) -> list[DataProblem]:
    """Problems for cells holding U+FFFD: undecodable bytes (errors, with their offsets) or,
    in a valid UTF-8 file, text damaged before it was saved (warnings)."""
    problems: list[DataProblem] = []
    offsets, total = scan_utf8(path)
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
        if bad is not None and len(problems) < MAX_PER_KIND:
            problems.append(DataProblem(name, int(rows[i]), col, bad))
        out.append(s if bad is None else "")
    return pd.Series(out, dtype="str"), problems


class _Records:
    """Collects JSON objects into chunks of converted columns."""

    def __init__(self, name: str, wanted: Sequence[str], info: FileInfo) -> None:
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

    def chunk(self) -> Table:
        rows = np.asarray(self.rows, dtype=np.int64)
        columns: dict[str, pd.Series] = {}
        problems, self.pending = self.pending, []
        for c in self.cols:
            columns[c], probs = _convert_column(self.name, c, self.values[c], rows,
                                                is_text=(c == self.wanted[0]))
            problems.extend(probs)
            self.values[c] = []
        self.rows = []
        return Table(columns, rows, problems)

    def end(self) -> Iterator[Table]:
        """The last chunk; then the checks that need the whole file."""
        if self.rows or self.pending:
            yield self.chunk()
        self.info.available = list(self.available)
        if self.count:
            missing = missing_columns(self.name, self.info.available, self.wanted)
            if missing:
                raise FileError(missing)
        elif not self.unreadable:
            raise FileError([DataProblem(self.name, None, None, "empty file (no records)")])


def _read_jsonl(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
                info: FileInfo) -> Iterator[Table]:
    with path.open("rb") as fh:
        first = fh.read(1 << 16).removeprefix(b"\xef\xbb\xbf").lstrip()
    if not first:
        raise FileError([DataProblem(name, None, None, "empty file (no records)")])
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
                     size: int, info: FileInfo) -> Iterator[Table]:
    """A ``.json`` file holding one array: parsed whole (the only format not streamed; use
    JSON Lines for large data), then validated in chunks."""
    try:
        with path.open("r", encoding="utf-8-sig") as fh:
            data = json.load(fh)
    except UnicodeDecodeError as err:
        raise FileError(
            [DataProblem(name, None, None, f"not valid UTF-8 at byte offset {err.start}")]
        ) from None
    except json.JSONDecodeError as err:
        raise FileError(
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
        raise FileError([DataProblem(name, None, None, "expected a JSON array of objects")])
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
                  info: FileInfo) -> Iterator[Table]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise FileError(
            [DataProblem(name, None, None, f"cannot read Parquet: {_short(err)}")]
        ) from None
    info.available = list(pf.schema_arrow.names)
    missing = missing_columns(name, info.available, wanted)
    if missing:
        raise FileError(missing)
    if pf.metadata.num_rows == 0:
        raise FileError([DataProblem(name, None, None, "empty file (no rows)")])
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
        yield Table(columns, rows, problems)
        if limit is not None and done >= limit:
            break


def _arrow_strings(col: Any) -> pd.Series:
    """A pyarrow string column as a pandas string Series, NA for nulls (no Python objects)."""
    return pd.Series(pd.array(col, dtype="str"))


def read_chunks(path: Path, name: str, wanted: Sequence[str], limit: int | None, size: int,
          info: FileInfo) -> Iterator[Table]:
    """The file's records in chunks of ``size`` (raises :class:`FileError` when it cannot be
    read at all)."""
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise FileError(
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
        raise FileError([DataProblem(name, None, None, f"file not found: {path}")])
    if path.is_dir():
        raise FileError([DataProblem(name, None, None, f"is a directory, not a file: {path}")])
    if path.stat().st_size == 0:
        raise FileError([DataProblem(name, None, None, "empty file (0 bytes)")])
    if suffix == ".csv":
        return _read_csv(path, name, wanted, limit, size, info)
    if suffix == ".parquet":
        return _read_parquet(path, name, wanted, limit, size, info)
    return _read_jsonl(path, name, wanted, limit, size, info)
