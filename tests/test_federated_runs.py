"""Whole federated WASP runs (fake models) whose votes are summed by a real Flower SecAgg+
simulation on the session's real two-node Ray cluster (``wasp.federated.ray_address``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.api import run_generation
from test_methods import _config, _fakes, _jsonl
from test_release_check import (
    PE_PUBLIC,
    _resume_pe,
    check_neighbours,
    pe_config,
    private_rows,
    run_pe,
)
from test_release_check import spy as spy  # noqa: F401 (the fixture)

pytest.importorskip("flwr")


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def test_wasp_federated_three_parties_through_secagg(tmp_path, ray_cluster):
    """The WASP loop (fake models) with its votes summed by a real Flower SecAgg+ simulation
    across 3 parties, min_parties 2: each round is charged, before it runs, at the worst-case
    noise of 2 of 3 noise shares, and the run still meets its epsilon."""
    cfg = _config(tmp_path, "tiny-wasp.yaml", generators=[{"model": "smollm2",
                                                           "max_new_tokens": 32}],
                  **{"synthesis.samples": 12, "synthesis.iterations": 1,
                     "wasp.federated": {"parties": 3, "dirichlet_alpha": 1.0,
                                        "min_parties": 2, "ray_address": ray_cluster}})
    run = run_generation(cfg, tmp_path / "fed", progress=False, **_fakes())
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["federated_parties"] == 3
    assert 0 < privacy["epsilon"] <= 4.0 + 1e-6
    votes = [m for m in privacy["mechanisms"] if m.get("name") == "topq_votes"]
    assert len(votes) == 1 and votes[0]["count"] == 1
    assert votes[0]["sigma"] == pytest.approx(privacy["noise_multiplier"]
                                              * privacy["topq_sensitivity"] * np.sqrt(2 / 3),
                                              rel=1e-9)
    assert "iter0/topq/started/1" in (run / "private" / "releases" / "releases.jsonl").read_text()
    stats = _jsonl(run / "stats.jsonl")
    assert len(stats) == 1 and stats[0]["vote_mass"] != 0
    assert len(_jsonl(run / "release" / "synthetic.jsonl")) == 12


def test_wasp_federated_record_neighbours(tmp_path, spy, ray_cluster):  # noqa: F811
    """Adding one record changes no exact count in what a federated run releases."""
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash since last week",
             "label": "clinical", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2,
                            "wasp.federated.parties": 3, "synthesis.iterations": 1,
                            "wasp.federated.ray_address": ray_cluster})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)
