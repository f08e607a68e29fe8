"""docs/adding-a-method.md's skeleton method, taken from the doc itself, runs through the runner
with the fakes: registered by one line, released, accounted and stated like the others."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from dpsynth.api import run_generation
from dpsynth.config import ConfigError, parse_config
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-method.md"


def _skeleton() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    return blocks[0]


def test_skeleton_is_about_forty_lines() -> None:
    code = [line for line in _skeleton().splitlines() if line.strip()]
    assert 30 <= len(code) <= 55


def test_skeleton_method_runs_through_the_runner(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth import methods

    (tmp_path / "keep_best_doc.py").write_text(_skeleton(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(methods.REGISTRY, "keep_best", "keep_best_doc:KeepBest")  # one line
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    cfg = pe_config("keep_best", write_csv(tmp_path / "d.csv", private_rows(40)))
    with pytest.raises(ConfigError, match=r"keep_best\.neighbors"):  # its section, validated
        parse_config({**cfg, "keep_best": {"neighbors": 2}})
    cfg["keep_best"] = {"neighbours": 2}
    run = Path(run_generation(parse_config(cfg), tmp_path / "run", progress=False,
                              generators=[FakeGenerator("fake-g0")], embedder=FakeEmbedder()))
    stored = yaml.safe_load((run / "config.yaml").read_text())
    assert stored["keep_best"] == {"neighbours": 2}  # kept with the run, locked on resume
    rows = [json.loads(line) for line in
            (run / "release" / "synthetic.jsonl").read_text().splitlines() if line]
    assert len(rows) == 9  # synthesis.samples
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["method"] == "keep_best"
    assert 0 < privacy["epsilon"] <= cfg["privacy"]["epsilon"] * (1 + 1e-9)
    keys = [json.loads(line)["key"] for line in
            (run / "private" / "releases" / "releases.jsonl").read_text().splitlines() if line]
    assert keys == ["label_counts", "iter0/votes", "iter1/votes"]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    sys.modules.pop("keep_best_doc", None)


def test_a_method_counts_its_own_work_for_the_plans_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dpsynth plan` takes the run's work from the method (``planned_work``), never by its
    name: the skeleton with a stage of its own shows that stage."""
    from typer.testing import CliRunner

    from dpsynth import methods
    from dpsynth.cli import app

    (tmp_path / "keep_best_doc.py").write_text(_skeleton(), encoding="utf-8")
    (tmp_path / "keep_best_plus.py").write_text(
        "from dpsynth.work import Stage\n"
        "from keep_best_doc import KeepBest\n\n\n"
        "class KeepBestPlus(KeepBest):\n"
        "    name = 'keep_best_plus'\n"
        "    section = 'keep_best_plus'\n\n"
        "    def planned_work(self, config, plan, detection_s):\n"
        "        work, stages = super().planned_work(config, plan, detection_s)\n"
        "        return work, [*stages, Stage('ranking the best', f'{plan.records} records',"
        " 0.0, 'negligible')]\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(methods.REGISTRY, "keep_best_plus", "keep_best_plus:KeepBestPlus")
    cfg = pe_config("keep_best_plus", write_csv(tmp_path / "d.csv", private_rows(40)))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    res = CliRunner().invoke(app, ["plan", str(tmp_path / "run.yaml"), "--no-data",
                                   "--records", "123", "--no-calibrate", "--json"])
    assert res.exit_code == 0, res.output
    stages = {s["stage"]: s for s in json.loads(res.output)["estimate"]["stages"]}
    assert stages["ranking the best"]["work"] == "123 records"
    assert "generation" in stages  # the inherited arithmetic
    for name in ("keep_best_doc", "keep_best_plus"):
        sys.modules.pop(name, None)


def test_the_pieces_table_names_every_hook_a_pe_method_overrides() -> None:
    """docs/adding-a-method.md's "What a PE method provides" lists each PEMethod hook a
    registered PE method overrides, and who overrides it: a new hook, or a method overriding
    one the table does not give it, fails here."""
    from dpsynth.methods import REGISTRY, method_class
    from dpsynth.methods.pe import PEMethod

    text = DOC.read_text(encoding="utf-8").split("## What a PE method provides", 1)[1]
    text = text.split("\n## ", 1)[0]
    table: dict[str, str] = {}
    for row in re.findall(r"^\| (`[^|]+`) \|.*\| ([^|]+) \|$", text, re.M):
        for name in re.findall(r"`(\w+)`", row[0]):
            table[name] = row[1]
    hooks = {n for n, v in vars(PEMethod).items() if callable(v) and not n.startswith("_")}
    assert set(table) <= hooks  # the table names real hooks
    shown = {"aug_pe": "Aug-PE", "wasp": "WASP", "secpe": "SecPE", "zero_shot": "zero-shot"}
    for name in REGISTRY:
        cls = method_class(name)
        if not issubclass(cls, PEMethod):
            continue
        overridden = {n for klass in cls.__mro__[:cls.__mro__.index(PEMethod)]
                      for n in vars(klass) if n in hooks}
        assert overridden <= set(table), (name, overridden - set(table))
        for hook in overridden - {"strategy"}:
            assert shown[name] in table[hook], (name, hook)
