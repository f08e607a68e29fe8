"""`dpsynth plan` and the plan every PE run shows before it spends anything (issue 24, point
7): the noise of each planned release, the expected votes per candidate against it, and a
plain sentence when the noise swamps them; for the operator only (terminal, private/)."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import dpsynth.api
from dpsynth.cli import app
from dpsynth.privacy import calibrate_steps
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import (
    exact_value_problems,
    pe_config,
    private_facts,
    private_rows,
    write_csv,
)


def _cfg(tmp_path: Path, rows: int = 61, method: str = "aug_pe", **over: object) -> Path:
    data = write_csv(tmp_path / "d.csv", private_rows(rows))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(pe_config(method, data, **over)))
    return path


def _plan(*argv: object) -> dict:
    res = CliRunner().invoke(app, ["plan", *map(str, argv), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_the_plan_matches_the_calibration_and_the_vote_arithmetic(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"privacy.accountant": "rdp"})
    plan = _plan(cfg)  # 61 records, 3 label classes, population 9 (pe_config)
    assert plan["records"] == 61 and plan["labels"] == 3 and plan["candidates"] == 18
    # the sizes histogram + 2 voting rounds, sensitivity 1, the run's accountant
    sigma = calibrate_steps(4.0, 1e-5, 3, kind="rdp")
    assert plan["noise_multiplier"] == pytest.approx(sigma, rel=1e-3)
    assert plan["expected_votes"] == pytest.approx(61 / 18)  # k = 1: one vote per record
    assert plan["ratio"] == pytest.approx(sigma * 18 / 61, rel=1e-3)
    # the automatic population: expected votes = 2 sigma, at least one sample a label class
    auto = _plan(cfg, "--set", "synthesis.samples=50", "--set", "synthesis.population=null")
    population = min(50, max(3, math.floor(61 / (2 * 2 * sigma))))  # L = 2
    assert auto["population"] == population and auto["candidates"] == 2 * population
    assert auto["samples"] == 50 and auto["ratio"] <= 0.5 and auto["verdict"] == "ok"
    # the same from a stated count, without the data
    assert _plan(cfg, "--no-data", "--records", 61)["noise_multiplier"] == \
        pytest.approx(plan["noise_multiplier"])


def test_noise_that_swamps_the_votes_is_said_plainly(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    res = CliRunner().invoke(app, ["plan", str(cfg), "--set", "privacy.epsilon=0.01"])
    assert res.exit_code == 0, res.output
    warning = " ".join(res.stderr.split())
    assert warning.startswith("warning: at epsilon 0.01 the noise on each candidate's votes")
    assert "the selection will be random; raise privacy.epsilon" in warning
    assert "or run method dp_finetune" in warning  # the measured alternative, named
    assert "votes per candidate: 3.39 expected" in res.stdout
    fine = _plan(cfg, "--no-data", "--records", 100000)
    assert fine["verdict"] == "ok" and "stand out" in fine["message"]
    assert "dp_finetune" not in fine["message"]
    wasp = _plan(cfg, "--no-data", "--records", 61, "--set", "method=wasp")
    assert wasp["vote_noise"] > wasp["noise_multiplier"]  # Top-Q's joint sensitivity
    res = CliRunner().invoke(app, ["plan", str(cfg), "--no-data"])
    assert res.exit_code == 2 and "--records" in res.output


def test_a_run_shows_its_plan_before_the_budget_and_keeps_it_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dpsynth.api, "run_generation", functools.partial(
        dpsynth.api.run_generation, generators=[FakeGenerator("fake-g0")],
        embedder=FakeEmbedder()))
    cfg = _cfg(tmp_path, **{"privacy.epsilon": 0.05, "synthesis.iterations": 1})
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["generate", str(cfg), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "the selection will be random" in " ".join(res.stderr.split())
    plan = json.loads((out / "private" / "plan.json").read_text())
    assert plan["records"] == 61 and plan["verdict"] == "random"
    assert oct((out / "private" / "plan.json").stat().st_mode)[-3:] == "600"
    counts, texts = private_facts(private_rows(61), "label", None)
    assert exact_value_problems(out, counts, texts) == []  # not in release/, stats, log
    assert "selection will be random" not in (out / "log.txt").read_text()


def test_plan_and_privacy_calibrate_share_one_calibration() -> None:
    """Issue 46: `privacy calibrate` said 1.8727 where `plan` said 2.005 for the demo. With
    --config it calibrates the run's own releases, and both print the same number."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from dpsynth.cli import app

    demo = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
    run = CliRunner()
    plan = run.invoke(app, ["plan", str(demo), "--json", "--no-calibrate"])
    assert plan.exit_code == 0, plan.output
    cal = run.invoke(app, ["privacy", "calibrate", "--config", str(demo), "--json"])
    assert cal.exit_code == 0, cal.output
    sigma = json.loads(cal.stdout)["sigma"]
    assert sigma == json.loads(plan.stdout)["noise_multiplier"]
    text = run.invoke(app, ["plan", str(demo), "--no-calibrate"]).output
    assert f"noise multiplier {sigma:.4g}" in text
    assert f"noise multiplier {sigma:.4g}" in run.invoke(
        app, ["privacy", "calibrate", "--config", str(demo)]).output
    bare = run.invoke(app, ["privacy", "calibrate", "--epsilon", "4", "--delta", "1e-5",
                            "--steps", "3"]).output
    assert "continuous Gaussian" in bare and "--config" in bare  # says why it differs
    res = run.invoke(app, ["privacy", "calibrate", "--epsilon", "4"])
    assert res.exit_code == 2 and "--steps" in res.output


def test_the_plan_shows_the_length_the_run_will_use(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    from_data = _plan(cfg)  # the rows run to 8-15 words: the 90th percentile's bin ends at 16
    assert from_data["max_words"] == 16 and "noisy estimate" in from_data["length_source"]
    declared = _plan(cfg, "--set", "synthesis.max_words=30")
    assert declared["max_words"] == 30 and "declared" in declared["length_source"]
    blind = _plan(cfg, "--no-data", "--records", 61)
    assert blind["max_words"] is None and "estimated by the run" in blind["length_source"]
    wasp = _plan(cfg, "--set", "method=wasp")
    assert wasp["length_source"] == ""  # WASP writes its generators' max_new_tokens


@pytest.mark.parametrize("method", ["aug_pe", "wasp"])
def test_the_run_and_dpsynth_plan_make_one_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                method: str) -> None:
    """One planner (``plan_pe``, a pure function of the config and ``PlanInputs``): the vote
    plan ``dpsynth plan`` prints from the data is the one the run keeps in private/plan.json,
    field for field (the automatic population and the records' length included)."""
    from dpsynth.config import load_config
    from dpsynth.methods import get_method
    from dpsynth.methods.pe import plan_pe
    from dpsynth.planning import PlanInputs

    monkeypatch.setattr(dpsynth.api, "run_generation", functools.partial(
        dpsynth.api.run_generation, generators=[FakeGenerator("fake-g0")],
        embedder=FakeEmbedder()))
    over = {"synthesis.iterations": 1, "synthesis.samples": 30,
            "synthesis.population": None, "synthesis.max_words": None}
    cfg = _cfg(tmp_path, method=method, **over)
    planned = _plan(cfg)
    planned.pop("estimate")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["generate", str(cfg), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "private" / "plan.json").read_text()) == planned
    if method == "aug_pe":  # sized from the data (WASP does not size its votes yet)
        assert planned["max_words"] and planned["population"] < 30
    # pure: the same inputs give the same plan, with nothing read or written
    config, m = load_config(cfg), get_method(method)
    inputs = PlanInputs(planned["records"], planned["labels"], words=planned["max_words"])
    monkeypatch.chdir(tmp_path / "run")
    first, again = plan_pe(m, config, inputs), plan_pe(m, config, inputs)
    assert first == again and first.votes is not None
    assert first.votes.to_dict() == planned
