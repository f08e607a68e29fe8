"""The CLI's one error path: every DpsynthError becomes ``error: <message>`` on stderr and exit
code 2 (caught by class in the root command group), never a traceback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from dpsynth.cli import ERROR_EXIT, DpsynthGroup, app
from dpsynth.errors import ComputeError, DpsynthError
from test_release_check import pe_config, private_rows, write_csv


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def _err_lines(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [line for line in result.stderr.splitlines() if line.strip()]


def _one_error(result) -> str:  # type: ignore[no-untyped-def]
    """Exit 2 and exactly one ``error:`` line on stderr, first; any further lines are indented
    details of it (e.g. one per invalid config field). Returns the whole of stderr."""
    assert result.exit_code == ERROR_EXIT, result.output
    lines = _err_lines(result)
    # the run's own progress (its plan, shown before the budget is touched) may come first
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, lines
    assert all(line.startswith("  ") for line in lines[errors[0] + 1:]), lines
    assert "Traceback" not in result.output
    return result.stderr


def _config(tmp_path: Path, **over: object) -> Path:
    data = write_csv(tmp_path / "d.csv", private_rows(20))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(pe_config("aug_pe", data, **over)), encoding="utf-8")
    return cfg


def test_bad_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cfg = _config(tmp_path, **{"privacy.epsilon": -1})
    result = CliRunner().invoke(app, ["generate", str(cfg), "-o", str(tmp_path / "r")])
    assert "privacy.epsilon" in _one_error(result)


def test_bad_data_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": broken\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["budget", "set", "--data", str(bad), "--text", "text",
                                      "--total-epsilon", "1"])
    assert result.exit_code == ERROR_EXIT, result.output
    lines = _err_lines(result)
    assert lines[0].startswith(f"error: --data {bad}")
    assert re.search(r"(row|line) 2\b", result.stderr)  # the loader names the bad line
    assert "broken" not in result.stderr and "Traceback" not in result.output


def test_ledger_refusal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # epsilon 4; real model names (the refusal comes before any model loads)
    cfg = _config(tmp_path, generators=[{"model": "smollm2"}], **{"embedder.model": "minilm"})
    runner = CliRunner()
    ok = runner.invoke(app, ["budget", "set", "--data", str(tmp_path / "d.csv"),
                             "--total-epsilon", "1"])
    assert ok.exit_code == 0, ok.output
    result = runner.invoke(app, ["generate", str(cfg), "-o", str(tmp_path / "r")])
    assert "refused" in _one_error(result)
    assert not (tmp_path / "r").exists()  # a refusal leaves no folder


@pytest.mark.parametrize("case", ["missing_config", "busy_folder", "a_file", "resume_nothing"])
def test_generate_refusals_are_exactly_one_error_line(tmp_path: Path, case: str) -> None:
    cfg = _config(tmp_path)
    out = tmp_path / "out"
    args = ["generate", str(cfg), "-o", str(out)]
    if case == "missing_config":
        args[1] = str(tmp_path / "absent.yaml")
        want = "config file not found"
    elif case == "busy_folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine", encoding="utf-8")
        want = "not a dpsynth run folder"
    elif case == "a_file":
        out.write_text("mine", encoding="utf-8")
        want = "is a file"
    else:
        args.append("--resume")
        want = "nothing to resume"
    result = CliRunner().invoke(app, args)
    assert want in _one_error(result)


def test_rag_refusals_are_exactly_one_error_line(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["rag", "ask", "Why?", "--kb", str(tmp_path / "nothing")])
    blank = runner.invoke(app, ["rag", "ask", "  ", "--kb", str(tmp_path)])
    no_config = runner.invoke(app, ["rag", "build", str(tmp_path / "absent.yaml"), "-o",
                                    str(tmp_path / "kb")])
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the `rag` extra is not installed
    no_extra = runner.invoke(app, ["rag", "serve", "--kb", str(tmp_path / "nothing")])
    for result, want in ((missing, "kb.jsonl"), (blank, "blank"),
                         (no_config, "config file not found"),
                         (no_extra, "pip install 'dpsynth[rag]'")):
        assert want in _one_error(result)


def test_corrupt_ledger_and_bad_option_are_one_line(tmp_path: Path, _ledger: Path) -> None:
    _ledger.write_text("{not json", encoding="utf-8")
    runner = CliRunner()
    shown = runner.invoke(app, ["budget", "show"])
    assert shown.exit_code == ERROR_EXIT
    (line,) = _err_lines(shown)
    assert line.startswith(f"error: {_ledger}: the budget ledger is corrupt (not valid JSON)")
    acct = runner.invoke(app, ["privacy", "epsilon", "--sigma", "1", "--delta", "1e-5",
                               "--steps", "2", "--accountant", "nope"])
    assert acct.exit_code == ERROR_EXIT
    assert len(_err_lines(acct)) == 1 and _err_lines(acct)[0].startswith("error: --accountant")


def test_any_dpsynth_error_subclass_is_caught_and_others_are_not() -> None:
    demo = typer.Typer(cls=DpsynthGroup)

    @demo.command()
    def boom(kind: str) -> None:
        if kind == "compute":
            raise ComputeError("round 3 could not finish")
        raise KeyError("a bug")

    @demo.command()
    def other() -> None:
        pass

    runner = CliRunner()
    res = runner.invoke(demo, ["boom", "compute"])
    assert res.exit_code == ERROR_EXIT and res.stderr == "error: round 3 could not finish\n"
    assert issubclass(ComputeError, DpsynthError)
    bug = runner.invoke(demo, ["boom", "bug"])
    assert bug.exit_code == 1 and isinstance(bug.exception, KeyError)  # bugs keep a traceback


def test_deliberate_errors_sit_in_the_hierarchy() -> None:
    from dpsynth import errors
    from dpsynth.federated import FederatedRoundError, InsufficientPartiesError
    from dpsynth.llm import GenerationError
    from dpsynth.privacy.errors import (
        BudgetExceededError,
        BudgetRefusedError,
        PrivacyConfigError,
    )
    from dpsynth.privacy.store import StoreLockedError

    want = {
        PrivacyConfigError: (errors.PrivacyError, ValueError),
        StoreLockedError: (errors.PrivacyError, ValueError),
        BudgetExceededError: (errors.PrivacyError, RuntimeError),
        BudgetRefusedError: (errors.PrivacyError, RuntimeError),
        FederatedRoundError: (errors.ComputeError, RuntimeError),
        InsufficientPartiesError: (errors.ComputeError,),
        errors.OutputFolderError: (FileExistsError,),
        errors.MissingFileError: (FileNotFoundError,),
        errors.MissingExtraError: (ImportError,),
    }
    for cls, bases in want.items():
        assert issubclass(cls, DpsynthError) and issubclass(cls, bases), cls
    assert GenerationError is errors.GenerationError
    err = GenerationError("backend x: HTTP 500", completed=3, total=8, status=500)
    assert (err.completed, err.total, err.status) == (3, 8, 500)
