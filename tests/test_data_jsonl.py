"""write_jsonl / read_jsonl: atomic writes and line-numbered read errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from dpsynth.data import DataError, read_jsonl
from dpsynth.io import write_jsonl


def test_round_trip_unicode_and_numpy(tmp_path: Path) -> None:
    rows = [
        {"text": "caf\u00e9 \u2615 \u201cquoted\u201d\nnew line", "label": "a"},
        {"text": "two", "score": np.float32(0.5), "n": np.int64(3), "v": np.arange(2)},
    ]
    path = tmp_path / "sub" / "out.jsonl"
    assert write_jsonl(path, iter(rows)) == 2
    raw = path.read_text(encoding="utf-8")
    assert raw.count("\n") == 2  # one line per row: the newline inside the text is escaped
    assert "caf\u00e9" in raw  # written as UTF-8, not \\u escapes
    back = read_jsonl(path)
    assert back[0] == rows[0]
    assert back[1] == {"text": "two", "score": 0.5, "n": 3, "v": [0, 1]}


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("generator died mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_jsonl(path, rows())
    assert read_jsonl(path) == [{"a": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left

    with pytest.raises(TypeError, match="row 2: expected a dict"):
        write_jsonl(path, [{"a": 3}, ["not", "a", "dict"]])
    assert read_jsonl(path) == [{"a": 1}]


def test_mode(tmp_path: Path) -> None:
    path = tmp_path / "private.jsonl"
    write_jsonl(path, [{"x": 1}], mode=0o600)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_read_errors_are_line_numbered(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"ok": 1}\n\n{"broken": \n[1, 2]\n{"bad": "\xff"}\n' + json.dumps({"ok": 2}).encode()
    )
    with pytest.raises(DataError) as ei:
        read_jsonl(path)
    got = [(p.row, p.message.split(":")[0]) for p in ei.value.problems]
    assert got == [
        (3, "invalid JSON"),
        (4, "expected a JSON object, got an array"),
        (5, "not valid UTF-8 (column 10)"),
    ]
    assert "bad.jsonl, row 3: invalid JSON" in str(ei.value)


def test_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        read_jsonl(tmp_path / "none.jsonl")
