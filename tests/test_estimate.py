"""`dpsynth plan`'s wall-time estimate (issue 46): calibrated rates times the plan's counts,
cached per model and machine, and no number for a generator it cannot time (a remote one);
each method's work by its own arithmetic (Aug-PE, WASP, SecPE, DP-SynRAG, dp_finetune)."""

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
    # the first pool, then the new variations (the kept samples: from the embedding cache)
    assert (work.private_records, work.synthetic_embeds) == (61, 18 + 9)
    more = est.pe_work(records=61, samples=30, candidates=18, population=9, iterations=2,
                       lookahead=1)
    assert more.generations == 30 + 9 + (30 - 9) + 2 * 18  # + the release's top-up, lookahead
    assert more.synthetic_embeds == 18 + 9 + 2 * 18
    assert est.pe_work(61, 9, 18, 9, 0).private_records == 0  # no vote: no private embedding


def test_the_estimate_multiplies_the_rates_by_the_plans_counts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    work = est.pe_work(records=61, samples=9, candidates=18, population=9, iterations=2)
    rates = ([est.Rate(per_s=120.0, load_s=2.0, seconds=3.0)],
             est.Rate(per_s=50.0, load_s=1.0, seconds=1.5))
    estimate = est.estimate_run(cfg, work, [24], rates=rates)
    by = {s.stage: s for s in estimate.stages}
    assert by["generation"].seconds == pytest.approx(27 * 24 / 120.0)
    assert by["embedding"].seconds == pytest.approx((61 + 27) / 50.0)
    assert by["loading models"].seconds == pytest.approx(3.0)
    assert by["private vote and noise"].time_text == "negligible"
    assert estimate.total_s == pytest.approx(27 * 24 / 120.0 + 88 / 50.0 + 3.0)
    assert estimate.calibration_s == pytest.approx(4.5) and estimate.complete
    text = "\n".join(estimate.lines())
    assert "27 texts x up to 24 tokens" in text and "61 private records + 27 synthetic" in text
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


# -- each method's own work ------------------------------------------------------------------
def _rate(per_s: float, load_s: float = 0.0) -> est.Rate:
    return est.Rate(per_s=per_s, load_s=load_s, seconds=1.0)


def test_wasp_splits_its_rounds_over_two_generators_each_at_its_own_rate(
        tmp_path: Path) -> None:
    cfg = parse_config(pe_config("wasp", tmp_path / "d.csv", generators=[
        {"model": "fake-g0", "max_new_tokens": 24}, {"model": "fake-g1"}]))
    # 10 samples over T + 1 = 3 rounds (4, 3, 3), each split evenly, the first taking the rest
    work = est.wasp_work(records=61, samples=10, iterations=2, generators=2, demonstrations=8)
    assert work.shares == (2 + 2 + 2, 2 + 1 + 1) and work.generations == 10
    # votes 1 and 2 embed rounds 0 and 1 (the last round is written after the last vote)
    assert (work.private_records, work.synthetic_embeds) == (61, 4 + 3)
    rates = ([_rate(10.0, 1.0), _rate(40.0, 2.0)], _rate(50.0, 0.5))
    estimate = est.estimate_run(cfg, work, [24, 32], rates=rates,
                                extra=est.wasp_stages(parties=0, iterations=2))
    by = {s.stage: s for s in estimate.stages}
    # g0 writes 6 texts at 10 tokens/s, g1 4 at 40 (an even 5/5 would give 12 + 4 = 16 s)
    assert by["generation"].seconds == pytest.approx(6 * 24 / 10.0 + 4 * 32 / 40.0)
    assert by["generation"].work == ("10 texts x up to 24/32 tokens (fake-g0: 6, fake-g1: 4); "
                                     "6 contrastive, up to 8 demonstrations a prompt (their "
                                     "reading not timed)")
    assert by["embedding"].seconds == pytest.approx((61 + 7) / 50.0)
    assert by["Top-Q nearest and furthest histograms and noise"].time_text == "negligible"
    assert by["loading models"].seconds == pytest.approx(3.5)
    assert estimate.complete and "preference training" not in by
    federated = est.estimate_run(cfg, work, [24, 32], rates=rates,
                                 extra=est.wasp_stages(parties=3, iterations=2))
    assert federated.stages[-1].time_text == ("not estimated: Flower and Ray are not "
                                              "calibrated") and not federated.complete
    zero = est.wasp_work(records=61, samples=10, iterations=0, generators=2)
    assert (zero.shares, zero.private_records, zero.synthetic_embeds) == ((5, 5), 0, 0)


def test_secpe_counts_its_pool_and_the_detection_this_plan_timed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    # 9 samples x L 3 = 27 candidates, all 9 kept a round: round 1's 18 variations
    work = est.secpe_work(records=61, samples=9, pool_multiplier=3, iterations=2)
    assert (work.generations, work.synthetic_embeds) == (27 + 18, 27 + 18)
    rates = ([_rate(100.0)], _rate(20.0))
    extra = est.secpe_stages(61, clusters=50, detection_s=2.5, iterations=2)
    estimate = est.estimate_run(cfg, work, [16], rates=rates, extra=extra)
    by = {s.stage: s for s in estimate.stages}
    assert by["generation"].seconds == pytest.approx(45 * 16 / 100.0)
    assert by["embedding"].seconds == pytest.approx((61 + 45) / 20.0)
    assert by["representative vote and noise"].time_text == "negligible"
    assert by["secret detection and noise calibration"].seconds == 2.5
    assert by["public clustering (KMeans)"].time_text == "negligible"
    assert estimate.total_s == pytest.approx(7.2 + 5.3 + 2.5) and estimate.complete
    untimed = est.secpe_stages(61, clusters=50, detection_s=None, iterations=2)[0]
    assert untimed.time_text == "not estimated: not run by this plan"


def test_synrag_counts_keywords_embeddings_and_the_private_token_steps(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, generators=[{"model": "fake-g0"}, {"model": "fake-g9"}])
    work = est.rag_work(1000, clusters=12, tokens=24, target_size=32, rows=16, public_row=True,
                        keyword_tokens=48, max_doc_tokens=160, filter_tokens=3)
    assert work.contexts == 32 + 1  # two passes of 16 document rows, and the public row
    # rows that do not divide k: the last pass is filled up to its fixed shape
    assert est.rag_work(10, clusters=1, tokens=1, target_size=32, rows=20, public_row=False,
                        keyword_tokens=0, max_doc_tokens=8, filter_tokens=0).contexts == 40
    rates = ([_rate(100.0, 2.0)], _rate(50.0, 1.0))
    estimate = est.estimate_rag(cfg, work, rates=rates)
    by = {s.stage: s for s in estimate.stages}
    assert by["loading models"].work == "fake-g0, fake" and by["loading models"].seconds == 3.0
    assert by["keyword extraction"].seconds == pytest.approx(1000 * 48 / 100.0)
    assert by["embedding"].seconds == pytest.approx((1000 + 12) / 50.0)
    assert by["private prediction"].seconds == pytest.approx(12 * 24 * 33 / 100.0)
    assert "12 passages x 24 steps x 33 rows" in by["private prediction"].work
    assert by["self-filter"].seconds == pytest.approx(12 * 3 / 100.0)
    assert estimate.complete and len(estimate.rates) == 2  # the second generator is not run
    unknown = est.estimate_rag(cfg, est.rag_work(
        None, clusters=12, tokens=24, target_size=32, rows=32, public_row=False,
        keyword_tokens=0, max_doc_tokens=160, filter_tokens=0), rates=rates)
    by = {s.stage: s for s in unknown.stages}
    assert by["keyword extraction"].time_text == "negligible"  # vocabulary matching
    assert by["embedding"].seconds is None and "--records N" in by["embedding"].note
    assert by["private prediction"].seconds == pytest.approx(12 * 24 * 32 / 100.0)
    assert "self-filter" not in by and not unknown.complete


def test_dp_finetune_says_its_training_is_not_estimated(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    work = est.TuneWork(steps=40, batch=32.0, max_tokens=64, samples=100, sample_tokens=48)
    estimate = est.estimate_finetune(cfg, work, rates=([_rate(80.0, 5.0)], ""))
    by = {s.stage: s for s in estimate.stages}
    assert by["DP-SGD training"].seconds is None
    assert by["DP-SGD training"].time_text == f"not estimated: {est.FINETUNE_REASON}"
    assert "40 steps x 32 expected records = about 1280 per-record gradients" in \
        by["DP-SGD training"].work
    assert by["release sampling"].seconds == pytest.approx(100 * 48 / 80.0)
    assert by["loading models"].seconds is None  # torch's load is not the calibrated one
    assert not estimate.complete and "at least" in _total_line(estimate)


def test_dp_finetune_training_at_its_gradient_rate_over_its_workers(tmp_path: Path) -> None:
    """With a measured rate (per-record gradients a second on one thread) the training is
    the gradients over the rate times the pass workers, the load the rate's; at user level
    it stays unestimated (a user's passes follow their private record count)."""
    cfg = _cfg(tmp_path)
    work = est.TuneWork(steps=40, batch=32.0, max_tokens=64, samples=100, sample_tokens=48,
                        workers=2)
    estimate = est.estimate_finetune(cfg, work, rates=([_rate(80.0, 5.0)], ""),
                                     train_rate=_rate(4.0, 2.0))
    by = {s.stage: s for s in estimate.stages}
    assert by["DP-SGD training"].seconds == pytest.approx(1280 / (4.0 * 2))
    assert "in 2 process(es)" in by["DP-SGD training"].work
    assert by["loading models"].seconds == pytest.approx(2.0)
    assert estimate.complete and estimate.gradients
    assert "DP-SGD's gradients of public records" in estimate.caveat()
    users = est.estimate_finetune(cfg, est.TuneWork(40, 32.0, 64, 100, 48, unit="user",
                                                    workers=2),
                                  rates=([_rate(80.0, 5.0)], ""), train_rate=_rate(4.0, 2.0))
    training = {s.stage: s for s in users.stages}["DP-SGD training"]
    assert training.seconds is None and training.note == est.USER_REASON


def test_plan_estimates_wasp_by_its_own_counts(
        tmp_path: Path, fake_models: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(pe_config(
        "wasp", write_csv(tmp_path / "d.csv", private_rows(61)),
        generators=[{"model": "fake-g0", "max_new_tokens": 24},
                    {"model": "fake-g1", "max_new_tokens": 24}])))
    res = CliRunner().invoke(app, ["plan", str(config), "--json"])
    assert res.exit_code == 0, res.output
    stages = {s["stage"]: s for s in json.loads(res.stdout)["estimate"]["stages"]}
    # 9 samples over 3 rounds of 3, each split 2 / 1; votes embed rounds 0 and 1
    assert stages["generation"]["work"].startswith("9 texts x up to 24 tokens (fake-g0: 6, "
                                                   "fake-g1: 3); 6 contrastive")
    assert stages["embedding"]["work"] == "61 private records + 6 synthetic texts (fake)"
    assert "Top-Q nearest and furthest histograms and noise" in stages
    text = CliRunner().invoke(app, ["plan", str(config), "--no-calibrate"])
    assert text.exit_code == 0 and "fake-g0: 6, fake-g1: 3" in text.stdout


def test_plan_estimates_a_synrag_build(tmp_path: Path, fake_models: dict[str, int],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    example = Path(__file__).resolve().parents[1] / "examples" / "tiny-synrag.yaml"
    res = CliRunner().invoke(app, ["plan", str(example), "--json"])
    assert res.exit_code == 0, res.output
    estimate = json.loads(res.stdout)["estimate"]
    stages = {s["stage"]: s for s in estimate["stages"]}
    # 1000 demo documents; 12 clusters x 24 tokens x (32 document rows + the public row)
    assert stages["embedding"]["work"].startswith("1000 documents + 12 passages")
    assert "12 passages x 24 steps x 33 rows" in stages["private prediction"]["work"]
    assert stages["private prediction"]["seconds"] > 0 and estimate["complete"]
    assert fake_models == {"generator": 1, "embedder": 1}
    stated = CliRunner().invoke(app, ["plan", str(example), "--no-data", "--records", "50",
                                      "--no-calibrate"])
    assert stated.exit_code == 0, stated.output
    assert "50 documents + 12 passages" in stated.stdout
    bad = CliRunner().invoke(app, ["plan", str(example), "--no-data", "--records", "-5",
                                   "--no-calibrate"])
    assert bad.exit_code == 2 and "--records N needs N >= 1" in bad.output
    assert "Traceback" not in bad.output
