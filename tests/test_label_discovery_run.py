"""`data.label_domain: discover` through the production run path (docs/methods.md §0): the
domain is a noisy, thresholded release charged to the budget, its delta is part of the stated
delta, and a value held by one record does not reach release/."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpsynth.api import run_generation
from dpsynth.config import ConfigError
from dpsynth.privacy import Accountant, GaussianEvent
from fakes import FakeEmbedder, FakeGenerator


def _data(tmp_path):
    rows = [{"text": f"note {i} about a {dept} appointment and a follow up", "dept": dept}
            for i, dept in enumerate(["cardiology"] * 40 + ["dermatology"] * 40)]
    rows.append({"text": "a single note from the only oncology patient", "dept": "oncology"})
    path = tmp_path / "private.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _config(tmp_path, **privacy):
    return {
        "method": "aug_pe",
        "data": {"path": str(_data(tmp_path)), "labels": ["dept"], "label_domain": "discover",
                 "label_domain_sigma": 3.0, "label_domain_delta": 1e-7},
        "privacy": {"epsilon": 4.0, "delta": 1e-5, **privacy},
        "prompts": {"label_template": "The note is for {dept}."},
        "synthesis": {"samples": 8, "iterations": 1, "pool_multiplier": 2},
    }


def test_discovered_domain_is_charged_and_stated(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    from dpsynth.config import parse_config

    cfg = parse_config(_config(tmp_path))
    run = run_generation(cfg, tmp_path / "run", progress=False,
                         generators=[FakeGenerator()], embedder=FakeEmbedder())
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    domain = privacy["label_domain"]
    assert domain["mode"] == "discover"
    assert domain["values"] == {"dept": ["cardiology", "dermatology"]}  # not the singleton
    assert privacy["delta"] == pytest.approx(1e-5)  # accountant delta + discovery delta
    assert privacy["epsilon"] <= 4.0 * (1 + 1e-9)
    # the discovery release is accounted: re-derive epsilon from the recorded events
    names = {m["name"] for m in privacy["mechanisms"]}
    assert "label_domain" in names
    acc = Accountant(privacy["accountant"])
    sigma = json.loads((run / "run.json").read_text())["sigma"]
    acc.add(GaussianEvent(3.0, 1.0, 1, 1.0, "label_domain"))
    without = privacy["epsilon"]
    assert acc.epsilon(1e-5 - 1e-7) < without  # the votes add to the discovery cost
    assert sigma > 0
    # planned again by the same planner once the domain is out: the operator's vote plan
    # over the kept records and the released classes, at the run's noise multiplier
    plan = json.loads((run / "private" / "plan.json").read_text())
    assert plan["labels"] == 2 and plan["records"] == 80
    assert plan["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
    rows = [json.loads(x) for x in (run / "release" / "synthetic.jsonl").read_text().splitlines()]
    assert rows and all(r["labels"]["dept"] != "oncology" for r in rows)
    for path in (run / "release").rglob("*"):
        if path.is_file():
            assert "oncology" not in path.read_text(errors="replace")


def test_discovery_is_refused_without_a_dp_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    from dpsynth.config import parse_config

    raw = _config(tmp_path)
    raw["privacy"]["epsilon"] = float("inf")
    raw["privacy"]["noise"] = "seeded"  # epsilon inf is research mode only
    with pytest.raises(ConfigError, match="declare data.label_values"):
        run_generation(parse_config(raw), tmp_path / "run", progress=False,
                       generators=[FakeGenerator()], embedder=FakeEmbedder())
    assert not (tmp_path / "run").exists()
