"""The streaming loader: the text column stays on disk (a memory-mapped Arrow file), chunked
reading gives the same records, problems and fingerprint as reading the whole file."""

from __future__ import annotations

import gc
import json
import pickle
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth.columns import CodedColumn, TextColumn
from dpsynth.data import check_dataset, fingerprint_columns, load_dataset
from dpsynth.embed import embed_to_file

ROWS = [
    {"text": "the soup was cold, très froid", "label": "bad", "user": "u1"},
    {"text": "lovely staff\nand quick service", "label": "good", "user": "u2"},
    {"text": "would come back", "label": "good", "user": "u1"},
    {"text": "would come back", "label": "good", "user": "u3"},
]
# Digests of ROWS computed by the whole-file loader before streaming: the budget ledger keys on
# the fingerprint, so a run on the same file must find its ledger again.
PINNED = {
    "with_users": "3774c5c7e62e5930975aa2b87f373318744d12b6ac7d97a3f873221104a83cf7",
    "text_only": "c9ebd15c0027f0e5fc4904a0fd8f21919c7e0e22dc16e1080374c9ccf0d21a8f",
    "dropped": "a0df394d1792b7bbadb8a2462ca429fd0276e0e7b778247212d393ff4d724bea",
}


def _write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a CSV, JSONL or Parquet file, by ``path``'s suffix."""
    if path.suffix == ".csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _write(tmp_path: Path, suffix: str) -> Path:
    return _write_rows(tmp_path / f"data{suffix}", ROWS)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_fingerprint_is_the_pinned_whole_file_digest(tmp_path: Path, suffix: str) -> None:
    path = _write(tmp_path, suffix)
    assert load_dataset(path, "text", ["label"], user="user").fingerprint() == \
        PINNED["with_users"]
    assert load_dataset(path, "text").fingerprint() == PINNED["text_only"]
    dropped = load_dataset(path, "text", ["label"], on_duplicate="drop")
    assert fingerprint_columns(dropped.texts, [dropped.labels["label"]], ["label"], None) == \
        PINNED["dropped"]  # the records kept
    # the ledger knows the file by its bytes: dropping duplicates opens no new budget
    assert dropped.content_digest() == load_dataset(path, "text", ["label"]).content_digest()


def _messy_rows(n: int) -> list[dict]:
    rows = [{"text": f"record number {i} " + "word " * (i % 7), "label": "ab"[i % 2],
             "user": f"u{i % 13}"} for i in range(n)]
    rows[5]["text"] = "   "  # blank
    rows[40]["label"] = ""  # missing label
    rows[77]["text"] = rows[3]["text"]  # duplicate across a chunk boundary (chunks of 16)
    rows[78]["text"] = "x" * 300  # over max_chars
    return rows


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_small_chunks_give_the_whole_file_result(tmp_path: Path, suffix: str) -> None:
    rows = _messy_rows(100)
    path = _write_rows(tmp_path / f"messy{suffix}", rows)
    args = (path, "text", ["label"], "user")
    whole = check_dataset(*args, max_chars=200)
    chunked = check_dataset(*args, max_chars=200, chunk_rows=16)
    assert [str(p) for p in chunked.problems] == [str(p) for p in whole.problems]
    assert chunked.summary == whole.summary
    assert {p.row for p in whole.problems} == {6, 41, 79}
    assert [p.row for p in whole.warnings] == [78]  # the duplicate of row 4, 5 chunks later
    # valid records: the same dataset and fingerprint whatever the chunk size
    good = tmp_path / f"good{suffix}"
    keep = [r for i, r in enumerate(rows) if i not in (5, 40, 78)]
    if suffix == ".csv":
        pd.DataFrame(keep).to_csv(good, index=False)
    elif suffix == ".jsonl":
        good.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(keep), good)
    a = load_dataset(good, "text", ["label"], "user", on_duplicate="drop")
    b = load_dataset(good, "text", ["label"], "user", on_duplicate="drop", chunk_rows=7)
    assert a.fingerprint() == b.fingerprint()
    expected = [r["text"] for i, r in enumerate(keep) if i != 75]  # the dropped duplicate
    assert b.texts == expected and len(b) == len(expected)
    assert list(b.users) == [r["user"] for i, r in enumerate(keep) if i != 75]


def test_texts_stay_on_disk_in_a_private_file(tmp_path: Path) -> None:
    path = _write(tmp_path, ".csv")
    private = tmp_path / "private"
    ds = load_dataset(path, "text", ["label"], "user", text_dir=private)
    assert isinstance(ds.texts, TextColumn) and isinstance(ds.labels["label"], CodedColumn)
    files = list(private.rglob("*.arrow"))
    assert len(files) == 1
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
    assert ds.texts[-1] == ROWS[3]["text"] and ds.texts[1:3] == [r["text"] for r in ROWS[1:3]]
    assert [t for c in ds.texts.chunks(3) for t in c] == [r["text"] for r in ROWS]
    assert "soup" not in repr(ds.texts) and "u1" not in repr(ds.users)
    sub = ds.subset([3, 0])
    assert sub.texts == [ROWS[3]["text"], ROWS[0]["text"]] and sub.labels["label"] == [
        "good", "bad"]
    assert pickle.loads(pickle.dumps(sub.texts)) == sub.texts  # another process maps the file
    codes, classes = ds.joint_label_codes({"label": ["good", "bad"]})
    assert codes.tolist() == [1, 0, 0, 0] and classes == [("good",), ("bad",)]
    assert ds.with_label_domain({"label": ["good"]}).texts == [r["text"] for r in ROWS[1:]]


def test_a_temporary_text_folder_is_removed_with_the_dataset(tmp_path: Path) -> None:
    ds = load_dataset(_write(tmp_path, ".jsonl"), "text")
    folder = ds.texts._store.directory  # noqa: SLF001 - the test looks where the file is
    assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    del ds
    gc.collect()
    assert not folder.exists()


def test_embed_to_file_reads_a_text_column_in_slices(tmp_path: Path) -> None:
    texts = TextColumn.from_texts([f"t{i}" for i in range(10)], tmp_path / "p")

    class Fake:
        dim = 2
        seen: list[int] = []

        def embed(self, batch: list[str]) -> np.ndarray:
            self.seen.append(len(batch))
            return np.array([[float(t[1:]), 1.0] for t in batch], dtype=np.float32)

    fake = Fake()
    out = embed_to_file(fake, texts, len(texts), tmp_path / "e.npy", chunk=4)
    assert out[:, 0].tolist() == list(range(10)) and fake.seen == [4, 4, 2]
