"""Nothing is charged before everything public is checked (issue 43, finding 5): a missing
vocabulary file, an unknown model, a config whose method is not the command's, an empty or
key-less config. Each is refused before the ledger is touched and leaves no run folder;
``dpsynth plan`` plans the configured method. Driven through the CLI as a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def cli(*argv: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in argv], env={"COLUMNS": "200"})


@pytest.fixture()
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger" / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def untouched(ledger: Path) -> bool:
    """No source and no run recorded (the ledger may exist, empty, once a key was made)."""
    if not ledger.exists():
        return True
    data = json.loads(ledger.read_text())
    return not data.get("sources") and not data.get("entries")


def refused(res, needle: str) -> None:  # type: ignore[no-untyped-def]
    assert res.exit_code == 2, res.output
    assert needle in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("sets", "needle"), [
    (["synrag.vocabulary=missing-terms.txt"], "missing-terms.txt"),
    (["synrag.vocabulary=[]"], "synrag.vocabulary"),
    (["generators.0.model=no-such-model"], "not a known model"),
])
def test_rag_build_checks_public_inputs_before_any_charge(ledger: Path, tmp_path: Path,
                                                          sets: list[str], needle: str) -> None:
    out = tmp_path / "kb"
    args = ["rag", "build", EXAMPLES / "tiny-synrag.yaml", "-o", out]
    for s in sets:
        args += ["--set", s]
    refused(cli(*args), needle)
    assert untouched(ledger) and not out.exists()


def test_an_empty_vocabulary_file_is_refused_before_any_charge(ledger: Path,
                                                               tmp_path: Path) -> None:
    empty = tmp_path / "terms.txt"
    empty.write_text("the\nand\n")  # stop words only: no usable term
    out = tmp_path / "kb"
    refused(cli("rag", "build", EXAMPLES / "tiny-synrag.yaml", "-o", out, "--set",
                f"synrag.vocabulary={empty}"), "no usable term")
    assert untouched(ledger) and not out.exists()


def test_rag_build_refuses_a_config_of_another_method(ledger: Path, tmp_path: Path) -> None:
    out = tmp_path / "kb"
    refused(cli("rag", "build", EXAMPLES / "demo.yaml", "-o", out), "set method: synrag")
    assert untouched(ledger) and not out.exists()


def test_generate_refuses_a_synrag_config(ledger: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    refused(cli("generate", EXAMPLES / "tiny-synrag.yaml", "-o", out), "rag build")
    assert untouched(ledger) and not out.exists()


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "{}\n"])
def test_an_empty_config_is_refused_not_run_as_the_demo(ledger: Path, tmp_path: Path,
                                                        text: str) -> None:
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    out = tmp_path / "run"
    refused(cli("generate", config, "-o", out), "the config is empty")
    assert untouched(ledger) and not out.exists()
    refused(cli("plan", config), "the config is empty")


def test_a_yaml_error_names_its_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("method: aug_pe\ndata:\n  path: demo\n  labels: [a, b\n")
    res = cli("plan", config)
    assert res.exit_code == 2 and "bad.yaml, line" in res.output, res.output


def test_plan_plans_the_configured_method(ledger: Path) -> None:
    res = cli("plan", EXAMPLES / "tiny-synrag.yaml", "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["method"] == "synrag" and plan["accountant"] == "zcdp"
    names = {r["name"] for r in plan["releases"]}
    assert {"keyword_histogram", "cluster_centre", "cluster_threshold",
            "private_token"} <= names
    assert plan["planned_epsilon"] <= plan["target_epsilon"] + 1e-9
    assert plan["planned_epsilon"] > 0.99 * plan["target_epsilon"]  # c calibrated to it
    text = cli("plan", EXAMPLES / "tiny-synrag.yaml")
    assert text.exit_code == 0 and "DP-SynRAG build plan" in text.output
    assert untouched(ledger)
