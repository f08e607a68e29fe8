"""Loading and validating private data: every ugly input gets a clear, located error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth.data import (
    DataError,
    DataProblem,
    Dataset,
    check_dataset,
    load_dataset,
)


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    pd.DataFrame(rows, columns=columns).to_csv(path, index=False)
    return path


def problems_of(excinfo: pytest.ExceptionInfo[DataError]) -> list[DataProblem]:
    return excinfo.value.problems


GOOD = [
    {"text": "the soup was cold", "label": "bad", "user": "u1"},
    {"text": "lovely staff and quick service", "label": "good", "user": "u2"},
    {"text": "would come back", "label": "good", "user": "u1"},
]


def test_csv_loads_texts_labels_users_in_order(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "data.csv", GOOD)
    ds = load_dataset(path, "text", ["label"], user="user")
    assert ds.texts == [r["text"] for r in GOOD]
    assert ds.labels == {"label": ["bad", "good", "good"]}
    assert ds.users == ["u1", "u2", "u1"]
    assert len(ds) == 3
    assert ds.source == "data.csv"
    assert (ds.text_column, ds.label_columns, ds.user_column) == ("text", ["label"], "user")
    codes, classes = ds.label_codes("label", ["good", "bad"])  # declared order, not sorted
    assert classes == ["good", "bad"]
    assert codes.tolist() == [1, 0, 0]
    assert ds.warnings == []


def test_csv_keeps_na_strings_as_values(tmp_path: Path) -> None:
    path = tmp_path / "na.csv"
    path.write_text("text,label\nNA,None\nnull,NaN\n", encoding="utf-8")
    ds = load_dataset(path, "text", ["label"])
    assert ds.texts == ["NA", "null"]
    assert ds.labels["label"] == ["None", "NaN"]


def test_joint_label_codes_and_no_labels(tmp_path: Path) -> None:
    rows = [
        {"text": "a", "cat": "x", "stars": 1},
        {"text": "b", "cat": "y", "stars": 2},
        {"text": "c", "cat": "x", "stars": 1},
        {"text": "d", "cat": "x", "stars": 2},
    ]
    path = write_csv(tmp_path / "j.csv", rows)
    ds = load_dataset(path, "text", ["cat", "stars"],
                      label_values={"cat": ["x", "y"], "stars": ["1", "2"]})
    codes, classes = ds.joint_label_codes()
    assert classes == [("x", "1"), ("x", "2"), ("y", "1"), ("y", "2")]  # ("y", "1"): no record
    assert codes.tolist() == [0, 3, 0, 1]
    plain = load_dataset(path, "text")
    codes, classes = plain.joint_label_codes()
    assert classes == [()]
    assert codes.tolist() == [0, 0, 0, 0]
    with pytest.raises(KeyError, match="label columns"):
        ds.label_codes("nope")


def test_subset_and_fingerprint(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "data.csv", GOOD)
    ds = load_dataset(path, "text", ["label"], user="user")
    sub = ds.subset([2, 0])
    assert sub.texts == [GOOD[2]["text"], GOOD[0]["text"]]
    assert sub.labels["label"] == ["good", "bad"]
    assert sub.users == ["u1", "u1"]
    masked = ds.subset(np.array([True, False, True]))
    assert masked.texts == [GOOD[0]["text"], GOOD[2]["text"]]
    fp = ds.fingerprint()
    assert len(fp) == 64
    assert ds.subset([0, 1, 2]).fingerprint() == fp
    assert ds.subset([1, 0, 2]).fingerprint() != fp  # order matters
    relabelled = Dataset(
        texts=list(ds.texts),
        labels={"label": ["bad", "good", "bad"]},
        users=ds.users,
        source=ds.source,
        text_column="text",
        label_columns=["label"],
        user_column="user",
    )
    assert relabelled.fingerprint() != fp
    no_users = Dataset(ds.texts, ds.labels, None, ds.source, "text", ["label"], None)
    assert no_users.fingerprint() != fp


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found") as ei:
        load_dataset(tmp_path / "nope.csv", "text")
    assert problems_of(ei)[0].file == "nope.csv"


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "data.xlsx"
    path.write_text("whatever")
    with pytest.raises(DataError, match=r"unsupported file type '\.xlsx'.*\.csv"):
        load_dataset(path, "text")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_zero_byte_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty{suffix}"
    path.write_bytes(b"")
    with pytest.raises(DataError, match="empty file"):
        load_dataset(path, "text")


def test_header_only_csv(tmp_path: Path) -> None:
    path = tmp_path / "header.csv"
    path.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(DataError, match="no data rows"):
        load_dataset(path, "text", ["label"])


def test_blank_lines_only_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text("\n  \n\n", encoding="utf-8")
    with pytest.raises(DataError, match="empty file"):
        load_dataset(path, "text")


def test_missing_columns_list_available(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "data.csv", GOOD)
    with pytest.raises(DataError) as ei:
        load_dataset(path, "body", ["label", "stars"])
    probs = problems_of(ei)
    assert [p.field for p in probs] == ["body", "stars"]
    msg = str(ei.value)
    assert "column not found" in msg
    assert "available columns: 'text', 'label', 'user'" in msg


def test_missing_column_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "y": 1}\n{"text": "b", "z": 2}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"'label'.*column not found.*'text', 'y', 'z'"):
        load_dataset(path, "text", ["label"])


def test_column_given_twice(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "data.csv", GOOD)
    with pytest.raises(DataError, match="given twice"):
        load_dataset(path, "text", ["text"])


def test_non_utf8_csv_names_row_field_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    content = "text,label\nfine row,a\ncaf\u00e9 cr\u00e8me,b\nok,c\n"
    path.write_bytes(content.encode("latin-1"))
    bad_offset = content.encode("latin-1").index(b"\xe9")
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"])
    probs = problems_of(ei)
    cell = [p for p in probs if p.row is not None]
    assert [(p.row, p.field) for p in cell] == [(2, "text")]
    assert "not valid UTF-8 (2 undecodable bytes)" in cell[0].message
    file_level = [p for p in probs if p.row is None]
    assert f"byte offset {bad_offset} (file line 3)" in file_level[0].message


def test_replacement_character_in_valid_utf8_is_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "fffd.csv"
    path.write_text("text\nbroken \ufffd char\nfine\n", encoding="utf-8")
    ds = load_dataset(path, "text")
    assert ds.texts == ["broken \ufffd char", "fine"]
    (w,) = ds.warnings
    assert (w.row, w.field, w.severity) == (1, "text", "warning")
    assert "U+FFFD" in w.message


def test_csv_with_ragged_row(tmp_path: Path) -> None:
    path = tmp_path / "ragged.csv"
    path.write_text("text,label\na,x\nb,y,extra secret words\nc,z\n", encoding="utf-8")
    with pytest.raises(DataError, match="cannot parse CSV.*Expected 2 fields in line 3, saw 3"):
        load_dataset(path, "text", ["label"])


def test_non_utf8_after_chunk_boundary(tmp_path: Path) -> None:
    """A multi-byte character cut by the scanner's 1 MiB chunks is not a false alarm."""
    from dpsynth.data.readers import scan_utf8

    head = "x" * ((1 << 20) - 1) + "\u00e9"  # 2-byte char straddles the chunk boundary
    path = tmp_path / "big.txt"
    path.write_bytes(head.encode() + b"\nabc\xff\n")
    found, total = scan_utf8(path)
    assert total == 1
    assert found == [(len(head.encode()) + 4, 2)]


def test_non_utf8_jsonl_names_line_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    good = b'{"text": "hello"}\n'
    path.write_bytes(good + b'{"text": "bad \xff byte"}\n')
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text")
    (p,) = problems_of(ei)
    assert p.row == 2
    assert f"byte offset {len(good) + 14}" in p.message
    assert "0xff" in p.message


def test_empty_and_whitespace_text(tmp_path: Path) -> None:
    rows = [
        {"text": "ok", "label": "a"},
        {"text": "", "label": "a"},
        {"text": "   \t ", "label": "b"},
        {"text": "fine", "label": "b"},
    ]
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"])
    probs = problems_of(ei)
    assert [(p.row, p.field) for p in probs] == [(2, "text"), (3, "text")]
    assert all("empty or whitespace-only text" in p.message for p in probs)
    assert str(probs[0]) == "data.csv, row 2, field 'text': empty or whitespace-only text"


def test_missing_and_nan_labels(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text,label,stars\na,x,1\nb,,2\nc,y\n", encoding="utf-8")
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label", "stars"])
    got = {(p.row, p.field) for p in problems_of(ei)}
    assert got == {(2, "label"), (3, "stars")}

    jl = tmp_path / "d.jsonl"
    jl.write_text(
        '{"text": "a", "label": 1}\n{"text": "b", "label": null}\n{"text": "c"}\n'
        '{"text": "d", "label": NaN}\n{"text": "e", "label": 4.0}\n',
        encoding="utf-8",
    )
    with pytest.raises(DataError) as ei:
        load_dataset(jl, "text", ["label"])
    assert [(p.row, p.field) for p in problems_of(ei)] == [(2, "label"), (3, "label"), (4, "label")]

    pq = tmp_path / "d.parquet"
    pd.DataFrame({"text": ["a", "b"], "label": [1.0, math.nan]}).to_parquet(pq)
    with pytest.raises(DataError) as ei:
        load_dataset(pq, "text", ["label"])
    assert [(p.row, p.field) for p in problems_of(ei)] == [(2, "label")]


def test_wrong_json_types(tmp_path: Path) -> None:
    jl = tmp_path / "d.jsonl"
    jl.write_text(
        '{"text": 5, "label": "a"}\n{"text": "ok", "label": [1, 2]}\n[1, 2]\n', encoding="utf-8"
    )
    with pytest.raises(DataError) as ei:
        load_dataset(jl, "text", ["label"])
    msgs = [(p.row, p.field, p.message) for p in problems_of(ei)]
    assert msgs == [
        (1, "text", "expected a string, got int"),
        (2, "label", "expected a string or number, got list"),
        (3, None, "expected a JSON object, got an array"),
    ]


def test_huge_document_over_limit(tmp_path: Path) -> None:
    long = "word " * 5000  # 25,000 characters
    rows = [{"text": "short", "label": "a"}, {"text": long, "label": "a"}]
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"])
    (p,) = problems_of(ei)
    assert (p.row, p.field) == (2, "text")
    assert "25,000 characters, over the limit of 20,000" in p.message
    ds = load_dataset(path, "text", ["label"], max_chars=None)
    assert len(ds.texts[1]) == 25_000
    assert len(load_dataset(path, "text", ["label"], max_chars=30_000)) == 2


def test_private_text_never_in_full_in_errors(tmp_path: Path) -> None:
    secret = "My name is Jonathan Q. Secretperson and my card number is 4111 1111 1111 1111. " * 300
    rows = [
        {"text": secret, "label": "a"},
        {"text": "x", "label": ""},
    ]
    path = write_csv(tmp_path / "data.csv", rows)
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"], max_chars=1000)
    msg = str(ei.value)
    assert "row 1" in msg and "row 2" in msg
    # a cell is named by file, row, field and length only: not a word of it
    for word in ("Jonathan", "Secretperson", "4111", "My name"):
        assert word not in msg
    assert "text has 23,700 characters, over the limit of 1,000" in msg
    report = check_dataset(path, "text", ["label"], max_chars=1000)
    assert secret not in json.dumps([q.to_dict() for q in report.problems])


def test_duplicates_are_warnings(tmp_path: Path) -> None:
    rows = [
        {"text": "same", "label": "a"},
        {"text": "same", "label": "b"},  # different label: not a duplicate
        {"text": "other", "label": "a"},
        {"text": "same", "label": "a"},
    ]
    path = write_csv(tmp_path / "data.csv", rows)
    ds = load_dataset(path, "text", ["label"])
    assert len(ds) == 4
    (w,) = ds.warnings
    assert (w.row, w.severity) == (4, "warning")
    assert "duplicate record (same text and labels as row 1)" in w.message

    dropped = load_dataset(path, "text", ["label"], on_duplicate="drop")
    assert dropped.texts == ["same", "same", "other"]
    assert dropped.labels["label"] == ["a", "b", "a"]

    with pytest.raises(DataError, match="row 4.*duplicate"):
        load_dataset(path, "text", ["label"], on_duplicate="error")
    assert load_dataset(path, "text", ["label"], on_duplicate="ignore").warnings == []
    # without labels, rows 1, 2 and 4 share the text
    assert [w.row for w in load_dataset(path, "text").warnings] == [2, 4]
    with pytest.raises(ValueError, match="on_duplicate"):
        load_dataset(path, "text", on_duplicate="maybe")


def test_invalid_jsonl_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(
        '{"text": "one", "label": "a"}\n\n{"text": "two", "label": \n'
        '{"text": "three", "label": "b"}\n',
        encoding="utf-8",
    )
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"])
    (p,) = problems_of(ei)
    assert p.row == 3  # file line, the blank line 2 counted
    assert p.message.startswith("invalid JSON: Expecting value")


def test_jsonl_and_json_array(tmp_path: Path) -> None:
    recs = [{"text": "a b", "label": 1, "u": 7}, {"text": "c", "label": 2, "u": 8}]
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n", encoding="utf-8")
    ds = load_dataset(jl, "text", ["label"], user="u")
    assert ds.texts == ["a b", "c"]
    assert ds.labels["label"] == ["1", "2"]
    assert ds.users == ["7", "8"]
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + jl.read_bytes())
    assert load_dataset(bom, "text", ["label"], user="u").fingerprint() == ds.fingerprint()
    arr = tmp_path / "d.json"
    arr.write_text(json.dumps(recs), encoding="utf-8")
    assert load_dataset(arr, "text", ["label"], user="u").fingerprint() == ds.fingerprint()


def test_parquet_round_trip(tmp_path: Path) -> None:
    df = pd.DataFrame(
        {
            "text": ["first review", "second one", "third"],
            "stars": [5, 3, 5],
            "cat": ["food", "bar", "food"],
            "uid": [10, 11, 10],
        }
    )
    pq = tmp_path / "d.parquet"
    df.to_parquet(pq)
    ds = load_dataset(pq, "text", ["cat", "stars"], user="uid")
    assert ds.texts == df["text"].tolist()
    assert ds.labels == {"cat": ["food", "bar", "food"], "stars": ["5", "3", "5"]}
    assert ds.users == ["10", "11", "10"]
    csv = write_csv(tmp_path / "d.csv", df.to_dict("records"))
    assert load_dataset(csv, "text", ["cat", "stars"], user="uid").fingerprint() == ds.fingerprint()
    assert load_dataset(pq, "text", limit=2).texts == ["first review", "second one"]


def test_user_column_missing_values(tmp_path: Path) -> None:
    path = tmp_path / "u.csv"
    path.write_text("text,user\na,u1\nb,\nc,u2\n", encoding="utf-8")
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", user="user")
    (p,) = problems_of(ei)
    assert (p.row, p.field, p.message) == (2, "user", "missing or empty user id")


def test_limit_reads_first_rows(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "label": "a"} for i in range(50)]
    path = write_csv(tmp_path / "d.csv", rows)
    assert load_dataset(path, "text", limit=5).texts == [f"t{i}" for i in range(5)]
    jl = tmp_path / "d.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert load_dataset(jl, "text", limit=3).texts == ["t0", "t1", "t2"]


def test_all_problems_reported_at_once_and_capped_in_message(tmp_path: Path) -> None:
    rows = [{"text": "", "label": ""} for _ in range(30)]
    path = write_csv(tmp_path / "d.csv", rows)
    with pytest.raises(DataError) as ei:
        load_dataset(path, "text", ["label"])
    assert len(ei.value.problems) == 60
    msg = str(ei.value)
    assert msg.startswith("60 problems in d.csv:")
    assert "... and 40 more" in msg
    assert msg.count("\n  - ") == 20


def test_check_dataset_summary_and_no_raise(tmp_path: Path) -> None:
    rows = [
        {"text": "one two three", "label": "a", "user": "u1"},
        {"text": "four", "label": "b", "user": "u2"},
        {"text": "five six", "label": "a", "user": "u1"},
        {"text": "five six", "label": "a", "user": "u3"},
        {"text": " ", "label": "a", "user": "u3"},
    ]
    path = write_csv(tmp_path / "d.csv", rows)
    report = check_dataset(path, "text", ["label"], user="user")
    assert not report.ok
    assert [(p.row, p.field) for p in report.problems] == [(5, "text")]
    assert [w.row for w in report.warnings] == [4]
    s = report.summary
    assert s["rows"] == 5
    assert s["labels"] == {"label": {"a": 4, "b": 1}}
    assert s["users"] == 3
    assert s["text_chars"] == {"min": 1, "median": 8.0, "mean": 6.8, "max": 13}
    assert s["text_words"] == {"min": 0, "median": 2.0, "mean": 1.6, "max": 3}
    assert s["columns"] == ["text", "label", "user"]
    missing = check_dataset(tmp_path / "gone.csv", "text")
    assert not missing.ok and "file not found" in missing.problems[0].message


def test_utf8_scan_over_many_chunks_matches_a_whole_file_decode(tmp_path: Path) -> None:
    """Every undecodable span of a 3 MB file (so three 1 MiB chunks, characters cut at their
    ends) is found at the offset and line a one-piece decode of the whole file gives."""
    import codecs
    import random

    from dpsynth.data.readers import scan_utf8

    rng = random.Random(3)
    pieces = [b"ab" * 300, b"\n", "é".encode(), "€".encode(), "𝄞".encode(), b"\xff", b"\xc3",
              b"\xe2\x82"]
    data = b"".join(rng.choice(pieces) for _ in range(40000))
    path = tmp_path / "mixed.txt"
    path.write_bytes(data)
    starts: list[int] = []

    def note(err: UnicodeError) -> tuple[str, int]:
        assert isinstance(err, UnicodeDecodeError)
        starts.append(err.start)
        return "", err.end

    codecs.register_error("test-note-undecodable", note)
    data.decode("utf-8", errors="test-note-undecodable")
    newline_at = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    expected = [(s, int(np.searchsorted(newline_at, s)) + 1) for s in starts]
    assert len(data) > 2 * (1 << 20) and len(expected) > 100
    found, total = scan_utf8(path, max_offsets=10**9)
    assert (found, total) == (expected, len(expected))
    assert scan_utf8(path, max_offsets=5) == (expected[:5], len(expected))
