"""Chaos: a whole tiny Aug-PE run through a proxy that fails 30 % of requests (503, 429 with
Retry-After, connection resets) and hangs 5 %, in front of the real server over SmolLM2.

The run must finish without a human (no --resume), spend exactly the planned epsilon, and pay
for no request twice (every upstream 200 is one request-cache row).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from dpsynth.llm.server import create_app
from fault_proxy import FaultProxy, running

pytestmark = [pytest.mark.chaos, pytest.mark.models]

RATES = {"503": 0.12, "429": 0.08, "reset": 0.10, "hang": 0.05}


def test_tiny_run_completes_through_a_flaky_server(smollm, tmp_path, monkeypatch) -> None:
    from dpsynth.api import run_generation
    from dpsynth.privacy import Accountant, DiscreteGaussianEvent

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    raw = yaml.safe_load((Path(__file__).parents[1] / "examples" / "tiny-aug-pe.yaml")
                         .read_text())
    # the tiny example's sizes (12 samples, 2 iterations); shorter texts to save time
    raw["privacy"].update(noise="seeded", seed=3)
    with running(create_app(smollm, max_batch_requests=8)) as upstream, FaultProxy(
        upstream, rates=RATES, seed=11, retry_after=1, hang_s=60
    ) as proxy:
        raw["generators"] = [{
            "backend": "openai", "base_url": proxy.url, "model": "smollm2",
            "max_new_tokens": 16, "max_concurrency": 4,
            # generous per-attempt timeout: a slow (not hung) answer must not be paid twice
            "timeout_s": 40, "retry_budget_s": 900, "outage_patience_s": 120,
        }]
        cfg = tmp_path / "chaos.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        run = run_generation(cfg, tmp_path / "run", progress=False)

    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["attempts"] == 1  # no human, no --resume
    assert sum(proxy.faults.values()) > 0 and proxy.faults["503"] + proxy.faults["429"] > 0

    # no request paid twice: each upstream 200 is exactly one cached result
    with sqlite3.connect(run / "private" / "llm-cache.sqlite") as db:
        rows = db.execute("select count(*) from generations").fetchone()[0]
    assert proxy.paid_twice() == 0
    assert sum(proxy.upstream_ok.values()) == rows > 0
    summary = json.loads((run / "release" / "summary.json").read_text())
    assert summary["llm_calls"] == rows
    # truthful counters: every injected fault cost one failed attempt that was retried
    assert summary["http_retries"] == sum(proxy.faults.values())
    assert meta["history"][-1] == {"attempt": 1, "status": "finished", "error": None,
                                   "reason": None, "llm_calls": rows}

    # the final epsilon is the planned accountant value, faults or not
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    releases = (run / "private" / "releases" / "releases.jsonl").read_text().splitlines()
    acc = Accountant("pld")  # discrete Gaussian counts and k = 1 votes: shift profile (1,)
    acc.add(DiscreteGaussianEvent(sigma=privacy["noise_multiplier"], sensitivity=1.0,
                                  count=len([r for r in releases if r.strip()]), shifts=(1,)))
    assert privacy["epsilon"] == pytest.approx(acc.epsilon(1e-5), rel=1e-6)
    assert privacy["epsilon"] <= privacy["target_epsilon"] + 1e-6
