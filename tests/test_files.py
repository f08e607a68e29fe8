"""dpsynth.files: atomic writes (modes set before writing, atomic on error), JSONL; dpsynth.knn:
nearest()."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from dpsynth import files, knn
from dpsynth.errors import DpsynthError, InputError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_mode_is_given_to_os_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_open = os.open

    def spy(path, flags, mode=0o777, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & os.O_CREAT:
            seen.append(mode)
        return real_open(path, flags, mode, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", spy)
    files.atomic_write_bytes(tmp_path / "secret.bin", b"x", mode=0o600)
    assert seen == [0o600]
    assert _mode(tmp_path / "secret.bin") == 0o600


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        files.atomic_write_text(tmp_path / "a.txt", "hi", mode=0o644)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.txt") == 0o644
    assert (tmp_path / "a.txt").read_text() == "hi"


def test_default_mode_is_owner_only(tmp_path: Path) -> None:
    """Secure by default: a write that names no mode is readable by its owner only, even under
    a permissive umask."""
    old = os.umask(0o000)
    try:
        files.atomic_write_json(tmp_path / "r.json", {"a": np.int64(3), "b": np.arange(2)})
    finally:
        os.umask(old)
    assert _mode(tmp_path / "r.json") == 0o600
    assert (tmp_path / "r.json").read_text() == '{\n  "a": 3,\n  "b": [\n    0,\n    1\n  ]\n}\n'


def test_error_midway_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "rows.jsonl"
    files.write_jsonl(target, [{"a": 1}])

    def rows():  # type: ignore[no-untyped-def]
        yield {"a": 2}
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        files.write_jsonl(target, rows())
    assert files.read_jsonl(target) == [{"a": 1}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]


def test_write_jsonl_rejects_non_dict_rows(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="row 2"):
        files.write_jsonl(tmp_path / "x.jsonl", [{"a": 1}, [1, 2]])
    assert not (tmp_path / "x.jsonl").exists()


def test_jsonl_round_trip_and_streaming(tmp_path: Path) -> None:
    rows = [{"text": "é ünïcode", "n": i} for i in range(5)]
    assert files.write_jsonl(tmp_path / "r.jsonl", rows, mode=0o600) == 5
    assert _mode(tmp_path / "r.jsonl") == 0o600
    it = files.iter_jsonl(tmp_path / "r.jsonl")
    assert next(it) == rows[0]
    assert list(it) == rows[1:]
    assert "é" in (tmp_path / "r.jsonl").read_text(encoding="utf-8")


@pytest.mark.parametrize(("content", "reason"), [
    (b'{"a": 1}\n\n{"a": oops}\n', "invalid JSON"),
    (b'{"a": 1}\n\n[1, 2]\n', "expected a JSON object"),
    (b'{"a": 1}\n\n{"a": "\xff"}\n', "not valid UTF-8"),
])
def test_bad_line_names_file_and_line(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        files.read_jsonl(path)
    assert isinstance(err.value, DpsynthError)
    assert f"{path}, line 3: {reason}" in str(err.value)
    assert "oops" not in str(err.value)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        files.read_jsonl(tmp_path / "none.jsonl")


def test_nearest_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(50, 8)).astype(np.float32)
    q = rng.normal(size=(7, 8)).astype(np.float32)
    scores, ids = knn.nearest(q, base, k=3, metric="ip", threads=1, batch=3)
    want = np.argsort(-(q @ base.T), axis=1)[:, :3]
    assert np.array_equal(ids, want)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ base.T, want, 1), rtol=1e-5)
    d2, ids2 = knn.nearest(q, base, k=2, metric="l2")
    brute = ((q[:, None, :] - base[None]) ** 2).sum(-1)
    assert np.array_equal(ids2, np.argsort(brute, axis=1)[:, :2])
    np.testing.assert_allclose(d2, np.sort(brute, axis=1)[:, :2], rtol=1e-4)


def test_nearest_caps_k_and_handles_empty() -> None:
    base = np.eye(3, dtype=np.float32)
    scores, ids = knn.nearest(np.eye(3), base, k=10)
    assert ids.shape == (3, 3) and np.array_equal(ids[:, 0], [0, 1, 2])
    s0, i0 = knn.nearest(np.zeros((0, 3)), base, k=2)
    assert s0.shape == (0, 2) and i0.shape == (0, 2)
    with pytest.raises(ValueError, match="metric"):
        knn.nearest(np.eye(3), base, metric="cos")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dimension"):
        knn.nearest(np.ones((1, 4)), base)
