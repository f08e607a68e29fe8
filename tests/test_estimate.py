"""`dpsynth plan`'s wall-time estimate (issue 46): calibrated rates times the plan's counts,
cached per model and machine, and no number for a generator it cannot time (a remote one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import dpsynth.estimate as est
from dpsynth.cli import app
from dpsynth.config import parse_config
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv


def _cfg(tmp_path: Path, **over: object) -> Any:
    return parse_config(pe_config("aug_pe", tmp_path / "d.csv", **over))


@pytest.fixture
def fake_models(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The configured models load as fakes (counted), so the calibration runs without a real
    model."""
    loads = {"generator": 0, "embedder": 0}

    def generator(spec: Any) -> FakeGenerator:
        loads["generator"] += 1
        return FakeGenerator("g0")

    def embedder(ecfg: Any) -> FakeEmbedder:
        loads["embedder"] += 1
        return FakeEmbedder()

    monkeypatch.setattr(est, "load_generator", generator)
    monkeypatch.setattr(est, "_load_embedder", embedder)
    return loads


def _total_line(estimate: est.Estimate) -> str:
    return next(ln for ln in estimate.lines() if ln.strip().startswith("total"))


def test_the_work_follows_aug_pe_arithmetic() -> None:
    # 18 candidates (population 9 x L 2), 2 rounds, 9 released
    work = est.pe_work(records=61, samples=9, candidates=18, population=9, iterations=2)
    assert work.generations == 18 + 1 * (18 - 9) + 0  # initial pool, one round's variations
    assert (work.private_records, work.synthetic_embeds) == (61, 2 * 18)
    more = est.pe_work(records=61, samples=30, candidates=18, population=9, iterations=2,
                       lookahead=1)
    assert more.generations == 30 + 9 + (30 - 9) + 2 * 18  # + the release's top-up, lookahead
    assert more.synthetic_embeds == 2 * 18 * 2
    assert est.pe_work(61, 9, 18, 9, 0).private_records == 0  # no vote: no private embedding


def test_the_estimate_multiplies_the_rates_by_the_plans_counts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    work = est.pe_work(records=61, samples=9, candidates=18, population=9, iterations=2)
    rates = ([est.Rate(per_s=120.0, load_s=2.0, seconds=3.0)],
             est.Rate(per_s=50.0, load_s=1.0, seconds=1.5))
    estimate = est.estimate_run(cfg, work, [24], rates=rates)
    by = {s.stage: s for s in estimate.stages}
    assert by["generation"].seconds == pytest.approx(27 * 24 / 120.0)
    assert by["embedding"].seconds == pytest.approx((61 + 36) / 50.0)
    assert by["loading models"].seconds == pytest.approx(3.0)
    assert by["private vote and noise"].time_text == "negligible"
    assert estimate.total_s == pytest.approx(27 * 24 / 120.0 + 97 / 50.0 + 3.0)
    assert estimate.calibration_s == pytest.approx(4.5) and estimate.complete
    text = "\n".join(estimate.lines())
    assert "27 texts x up to 24 tokens" in text and "61 private records + 36 synthetic" in text
    assert "an estimate, not a promise: from a calibration of 4.5 s on this machine" in text


def test_two_generators_share_the_texts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, generators=[{"model": "fake-g0"}, {"model": "fake-g1"}])
    work = est.Work(generations=11, private_records=0, synthetic_embeds=0, iterations=0)
    rates = ([est.Rate(10.0, 0.0, 0.0), est.Rate(20.0, 0.0, 0.0)], est.Rate(1.0, 0.0, 0.0))
    gen = est.estimate_run(cfg, work, [4, 8], rates=rates).stages[1]
    assert gen.seconds == pytest.approx(6 * 4 / 10.0 + 5 * 8 / 20.0)
    assert gen.work == "11 texts x up to 4/8 tokens (fake-g0, fake-g1)"


def test_the_calibration_is_cached_and_read_on_a_second_call(
        tmp_path: Path, fake_models: dict[str, int]) -> None:
    cfg = _cfg(tmp_path)
    cache = est.RateCache(tmp_path / "cache" / "calibration.json")
    work = est.pe_work(61, 9, 18, 9, 2)
    first = est.estimate_run(cfg, work, [24], cache=cache)
    assert fake_models == {"generator": 1, "embedder": 1} and not first.cached
    assert first.complete and cache.path.is_file()
    second = est.estimate_run(cfg, work, [24], cache=cache, calibrate=False)
    assert fake_models == {"generator": 1, "embedder": 1}  # nothing loaded again
    assert second.cached and [s.seconds for s in second.stages] == [
        s.seconds for s in first.stages]
    assert "cached in" in " ".join(second.lines())
    # another model is another key: calibrated on its own
    est.estimate_run(_cfg(tmp_path, **{"generators": [{"model": "fake-g9"}]}), work, [24],
                     cache=cache)
    assert fake_models == {"generator": 2, "embedder": 1}


def test_a_remote_generator_is_not_estimated(tmp_path: Path, fake_models: dict[str, int]
                                             ) -> None:
    cfg = _cfg(tmp_path, generators=[{"model": "gpt", "backend": "openai",
                                      "base_url": "http://127.0.0.1:9/v1"}])
    estimate = est.estimate_run(cfg, est.pe_work(61, 9, 18, 9, 2), [24],
                                cache=est.RateCache(tmp_path / "c.json"))
    gen = next(s for s in estimate.stages if s.stage == "generation")
    assert gen.seconds is None and gen.time_text == "not estimated: remote generator"
    assert fake_models["generator"] == 0  # a server is never timed
    assert not estimate.complete and estimate.stages[2].seconds is not None  # embedding is
    assert "at least" in _total_line(estimate)


def test_without_a_calibration_nothing_is_invented(tmp_path: Path, fake_models: dict[str, int]
                                                   ) -> None:
    estimate = est.estimate_run(_cfg(tmp_path), est.pe_work(61, 9, 18, 9, 2), [24],
                                calibrate=False, cache=est.RateCache(tmp_path / "none.json"))
    assert fake_models == {"generator": 0, "embedder": 0}
    assert all(s.seconds is None for s in estimate.stages if s.note != "negligible")
    assert "no calibration of generator fake-g0 cached" in "\n".join(estimate.lines())
    assert _total_line(estimate).endswith("not estimated")


def test_a_model_that_does_not_load_gives_a_reason_not_a_number(tmp_path: Path) -> None:
    # the config names a fake model that load_generator refuses
    estimate = est.estimate_run(_cfg(tmp_path), est.pe_work(61, 9, 18, 9, 2), [24],
                                cache=est.RateCache(tmp_path / "c.json"))
    gen = estimate.stages[1]
    assert gen.seconds is None and "could not be loaded or run here" in gen.note


def test_plan_prints_the_table_and_reads_the_cache_the_second_time(
        tmp_path: Path, fake_models: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(pe_config(
        "aug_pe", write_csv(tmp_path / "d.csv", private_rows(61)))))
    res = CliRunner().invoke(app, ["plan", str(config)])
    assert res.exit_code == 0, res.output
    assert "estimated wall time on this machine" in res.stdout
    assert "stage" in res.stdout and "estimated time" in res.stdout
    assert "measured now" in res.stdout and "61 private records" in res.stdout
    assert (tmp_path / "xdg" / "dpsynth" / "calibration.json").is_file()
    again = CliRunner().invoke(app, ["plan", str(config), "--json", "--no-calibrate"])
    assert again.exit_code == 0, again.output
    estimate = json.loads(again.stdout)["estimate"]
    assert estimate["cached"] and estimate["complete"]
    assert fake_models == {"generator": 1, "embedder": 1}  # the second plan loaded nothing
    assert [s["stage"] for s in estimate["stages"]][:3] == ["loading models", "generation",
                                                            "embedding"]


def test_a_run_that_embeds_nothing_neither_times_nor_shows_the_embedder(
        tmp_path: Path, fake_models: dict[str, int]) -> None:
    work = est.pe_work(records=61, samples=9, candidates=9, population=9, iterations=0)
    estimate = est.estimate_run(_cfg(tmp_path), work, [24],
                                cache=est.RateCache(tmp_path / "c.json"))
    assert fake_models == {"generator": 1, "embedder": 0}
    assert [s.stage for s in estimate.stages] == ["loading models", "generation"]
    assert estimate.stages[0].work == "fake-g0" and estimate.complete
