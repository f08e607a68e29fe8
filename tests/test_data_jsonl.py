"""write_jsonl / read_jsonl: atomic writes and line-numbered read errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from dpsynth.errors import InputError
from dpsynth.files import iter_jsonl, read_jsonl, write_jsonl


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


def test_read_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"ok": 1}\n\n{"broken": \n[1, 2]\n{"bad": "\xff"}\n' + json.dumps({"ok": 2}).encode()
    )
    # streaming: the good line before the first bad one is read, then the bad line is named
    rows = iter_jsonl(path)
    assert next(rows) == {"ok": 1}
    with pytest.raises(InputError, match=r"bad\.jsonl, line 3: invalid JSON"):
        next(rows)
    for lineno, body, message in ((4, b"[1, 2]", "expected a JSON object, got list"),
                                  (5, b'{"bad": "\xff"}', r"not valid UTF-8 \(column 10\)")):
        one = tmp_path / f"line{lineno}.jsonl"
        one.write_bytes(b'{"ok": 1}\n' * (lineno - 1) + body + b"\n")
        with pytest.raises(InputError, match=rf"line{lineno}\.jsonl, line {lineno}: {message}"):
            read_jsonl(one)


def test_read_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        read_jsonl(tmp_path / "none.jsonl")
