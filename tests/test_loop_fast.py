"""The evolution loop end to end in seconds, with the deterministic fakes (tests/fakes.py):
sizes and labels of the release, retries of failed generations, and a crash resumed to the
same release as an uninterrupted run (noise is replayed, never redrawn; docs/methods.md §0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpsynth.api import run_generation
from dpsynth.config import parse_config
from dpsynth.llm import GenerationError
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, shared_files, write_csv


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _cfg(tmp_path: Path, method: str = "aug_pe", **over: Any) -> dict[str, Any]:
    return pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)), **over)


def _run(cfg: dict[str, Any], out: Path, gens: list[FakeGenerator], *,
         resume: bool = False) -> Path:
    config: Any = out if resume else parse_config(cfg)
    return Path(run_generation(config, out, resume=resume, progress=False, generators=gens,
                               embedder=FakeEmbedder()))


def _rows(run: Path, name: str = "synthetic.jsonl") -> list[dict[str, Any]]:
    lines = (run / "release" / name).read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line]


@pytest.mark.parametrize("method", ["aug_pe", "wasp", "zero_shot"])
def test_release_sizes_and_labels(tmp_path, method):
    gens = [FakeGenerator("fake-g0")]
    run = _run(_cfg(tmp_path, method, **{"wasp.top_q": 3, "wasp.demonstrations": 2}),
               tmp_path / "run", gens)
    rows = _rows(run)
    assert len(rows) == 9  # synthesis.samples
    assert {r["labels"]["label"] for r in rows} <= {"billing", "clinical", "scheduling"}
    assert all(r["generator"] == "fake-g0" and len(r["text"]) >= 12 for r in rows)
    summary = json.loads((run / "release" / "summary.json").read_text())
    assert summary["samples"] == 9 and summary["llm_calls"] == gens[0].misses > 0
    stats = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines()
             if line] if (run / "stats.jsonl").is_file() else []
    assert len(stats) == (0 if method == "zero_shot" else 2)


def test_failed_generations_are_retried_and_counted(tmp_path):
    gen = FakeGenerator("fake-g0", fail_every=5, refuse_every=7)
    run = _run(_cfg(tmp_path), tmp_path / "run", [gen])
    summary = json.loads((run / "release" / "summary.json").read_text())
    assert summary["retried"] > 0
    assert summary["sent"] == summary["requested"] + summary["retried"]
    assert summary["sent"] == gen.requests_seen
    assert all("sorry" not in r["text"].lower() for r in _rows(run))


def test_crash_then_resume_gives_the_uninterrupted_release(tmp_path):
    cfg = _cfg(tmp_path)
    # two ledgers: one ledger refuses a second run with the same seed on the same data
    whole = _run({**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "l1.json")}},
                 tmp_path / "whole", [FakeGenerator("fake-g0")])
    cfg["privacy"]["ledger"] = str(tmp_path / "l2.json")
    crashing = FakeGenerator("fake-g0", raise_after=22)  # 18 initial, dies in the variations
    with pytest.raises(GenerationError) as failed:
        _run(cfg, tmp_path / "crash", [crashing])
    # the CLI prints this under the error line: the work done so far is kept for --resume
    assert failed.value.hint is not None and "--resume" in failed.value.hint
    assert str(tmp_path / "crash") in failed.value.hint
    meta = json.loads((tmp_path / "crash" / "run.json").read_text())
    assert meta["status"] == "failed"
    before = (tmp_path / "crash" / "private" / "releases" / "releases.jsonl").read_text()
    assert before.count("\n") == 2  # label counts and the first votes were released
    done = _run(cfg, tmp_path / "crash", [FakeGenerator("fake-g0")], resume=True)
    a, b = shared_files(whole), shared_files(done)
    a.pop("release/summary.json")  # attempts and LLM-call counts differ, by design
    b.pop("release/summary.json")
    assert a == b
    # the resumed run replayed the stored noise: the store holds each key once
    after = (done / "private" / "releases" / "releases.jsonl").read_text()
    assert after.startswith(before)  # stored releases kept as they were, not redrawn
    lines = after.splitlines()
    keys = [json.loads(line)["key"] for line in lines if line]
    assert len(keys) == len(set(keys)) == 3  # label counts + 2 vote rounds
