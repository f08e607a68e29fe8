"""`dpsynth bench voting`: both paths run on the same embeddings and report what they promise."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app


def test_bench_voting_json_small(small_probe):
    res = CliRunner().invoke(
        app,
        ["bench", "voting", "--private", "3000", "--synthetic", "300", "--clusters", "20",
         "--dim", "32", "--json"],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("per_point_seconds", "representative_seconds", "speedup", "per_point_peak_mb",
                "representative_peak_mb", "public_clustering_seconds"):
        assert isinstance(out[key], float)
    assert out["speedup"] == pytest.approx(
        out["per_point_seconds"] / out["representative_seconds"], rel=1e-6)
    assert out["sampled_private"] == 3000 and out["clusters"] == 20
    assert out["per_point_seconds"] > 0 and out["representative_seconds"] > 0


def test_bench_voting_bad_rate():
    res = CliRunner().invoke(app, ["bench", "voting", "--private", "10", "--synthetic", "5",
                                   "--rate", "2", "--json"])
    assert res.exit_code != 0
    assert "--rate" in res.output
