"""`dpsynth data check` and `dpsynth data demo` through the real typer app."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from dpsynth.cli import app

runner = CliRunner()


def write(path: Path, rows: list[dict]) -> Path:
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_check_ok_exits_0_and_prints_summary(tmp_path: Path) -> None:
    path = write(
        tmp_path / "ok.csv",
        [{"text": "good food", "label": "pos"}, {"text": "cold soup", "label": "neg"}],
    )
    result = runner.invoke(app, ["data", "check", str(path), "--text", "text", "--label", "label"])
    assert result.exit_code == 0, result.output
    assert "rows" in result.output and "label 'label': 2 classes" in result.output
    assert "OK: 2 rows, 0 warning(s)." in result.output


def test_check_warnings_exit_0(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.csv", [{"text": "same"}, {"text": "same"}])
    result = runner.invoke(app, ["data", "check", str(path), "--text", "text"])
    assert result.exit_code == 0, result.output
    assert "warning dup.csv, row 2, field 'text': duplicate record" in result.output


def test_check_errors_exit_1_and_list_every_problem(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bad.csv",
        [
            {"text": "fine", "label": "a", "user": "u1"},
            {"text": " ", "label": "a", "user": "u1"},
            {"text": "x" * 50, "label": "", "user": ""},
        ],
    )
    args = ["data", "check", str(path), "--text", "text", "--label", "label", "--user", "user"]
    result = runner.invoke(app, [*args, "--max-chars", "20"])
    assert result.exit_code == 1
    out = result.output
    assert "bad.csv, row 2, field 'text': empty or whitespace-only text" in out
    assert "bad.csv, row 3, field 'text': text has 50 characters, over the limit of 20" in out
    assert "bad.csv, row 3, field 'label': missing or empty label" in out
    assert "bad.csv, row 3, field 'user': missing or empty user id" in out
    assert "4 error(s)" in out
    assert "x" * 50 not in out
    # no limit: the long text is fine
    result = runner.invoke(app, [*args, "--max-chars", "0"])
    assert "over the limit" not in result.output and result.exit_code == 1


def test_check_json_output(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", [{"text": "a b", "y": 1}, {"text": "c", "y": 2}])
    result = runner.invoke(
        app, ["data", "check", str(path), "--text", "text", "--label", "nope", "--json"]
    )
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["ok"] is False
    (problem,) = payload["problems"]
    assert problem["field"] == "nope"
    assert "available columns: 'text', 'y'" in problem["message"]

    result = runner.invoke(
        app, ["data", "check", str(path), "--text", "text", "--label", "y", "--json"]
    )
    assert result.exit_code == 0
    payload = json.loads(result.stdout)
    assert payload["summary"]["labels"] == {"y": {"1": 1, "2": 1}}
    assert payload["summary"]["text_words"]["max"] == 2


def test_check_missing_file_and_bad_extension(tmp_path: Path) -> None:
    result = runner.invoke(app, ["data", "check", str(tmp_path / "gone.csv"), "--text", "t"])
    assert result.exit_code == 1 and "file not found" in result.output
    other = tmp_path / "d.txt"
    other.write_text("hello")
    result = runner.invoke(app, ["data", "check", str(other), "--text", "t"])
    assert result.exit_code == 1 and "unsupported file type '.txt'" in result.output


def test_demo_writes_corpus_that_checks_clean(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = runner.invoke(app, ["data", "demo", "--out", str(out), "--n", "120", "--seed", "4"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["knowledge.json", "private.csv", "test.csv"]
    assert len(pd.read_csv(out / "private.csv")) == 120
    assert len(pd.read_csv(out / "test.csv")) == 300
    check = [
        "data", "check", str(out / "private.csv"), "--text", "text",
        "--label", "department", "--label", "urgency", "--user", "patient_id", "--json",
    ]  # fmt: skip
    result = runner.invoke(app, check)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["rows"] == 120
    assert set(summary["labels"]["urgency"]) == {"routine", "soon", "urgent"}
    assert summary["users"] < 120


def test_check_against_declared_values(tmp_path: Path) -> None:
    path = write(tmp_path / "d.csv", [{"text": "good food", "label": "pos"},
                                      {"text": "cold soup", "label": "meh"}])
    (tmp_path / "labels.txt").write_text("pos\nneg\n", encoding="utf-8")
    args = ["data", "check", str(path), "--text", "text", "--label", "label",
            "--values", f"label={tmp_path / 'labels.txt'}"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    shown = " ".join(result.output.split())
    assert "d.csv, row 2, field 'label': label value (3 characters) is not among the 2 " \
        "declared" in shown
    bad = runner.invoke(app, args[:-1] + ["other=x.txt"])
    assert bad.exit_code == 2 and "not a --label column" in bad.output
