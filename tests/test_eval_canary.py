"""The canary audit loop around the generation API.

The generator here is a stand-in for `dpsynth.api.run_generation` that memorises: it copies
some private records verbatim into release/. That makes the expected hit count known, so the
loop (data copy, canary insertion, private-area permissions, override, counting) is checked
exactly; the real generation is the lead's tests' business.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.eval.canary import canary_report, run_canary_audit, write_canary_data

CANARY = "the locker combination of Ysolde Frantzmark is 88-41-07"


def _fake_generation(calls: list, copy_rows: int):
    def run_generation(config, output_dir, *, overrides=None, progress=True, resume=False):
        calls.append({"config": str(config), "overrides": dict(overrides or {})})
        data = pd.read_csv(overrides["data.path"])
        run = Path(output_dir)
        (run / "release").mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"run_id": "x", "method": "aug_pe",
                                                  "status": "finished"}))
        rows = [{"text": t, "labels": {"department": d}}
                for t, d in zip(data["text"][:copy_rows], data["department"][:copy_rows],
                                strict=True)]
        rows.append({"text": "an unrelated synthetic message", "labels": {"department": "x"}})
        (run / "release" / "synthetic.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
        (run / "release" / "zero_shot.jsonl").write_text(
            json.dumps({"text": "zero shot text", "labels": {"department": "x"}}) + "\n")
        (run / "release" / "privacy.json").write_text(json.dumps({"epsilon": 4.0,
                                                                  "delta": 1e-5}))
        return run
    return run_generation


@pytest.fixture()
def config(tmp_path):
    from dpsynth.demo_corpus import write_demo_corpus

    data = write_demo_corpus(tmp_path / "data", n=40, seed=0, test_n=5)["private"]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"method": "aug_pe", "data": {
        "path": "data/private.csv", "text": "text", "labels": ["department"],
        "label_values": {"department": "demo"}}}))
    return cfg, data


def test_canary_loop_counts_memorised_copies(config, tmp_path):
    cfg, data = config
    calls: list = []
    generate = _fake_generation(calls, copy_rows=40)
    out = tmp_path / "audit"
    res = run_canary_audit(cfg, out, generate=generate, canary=CANARY, copies=6, seed=1,
                           progress=False)
    canary_file = Path(calls[0]["overrides"]["data.path"])
    assert canary_file.parent == out / "private"
    assert stat.S_IMODE((out / "private").stat().st_mode) == 0o700
    assert stat.S_IMODE(canary_file.stat().st_mode) == 0o600
    planted = pd.read_csv(canary_file)
    original = pd.read_csv(data)
    assert planted["text"].str.contains(CANARY, regex=False).sum() == 6
    assert (planted["text"] != original["text"]).sum() == 6
    assert planted.drop(columns="text").equals(original.drop(columns="text"))
    # the stand-in copied all 40 records: the 6 canaries come back exactly
    assert res["synthetic"]["exact"] == 6 and res["synthetic"]["near"] == 0
    assert res["zero_shot"]["exact"] == 0
    assert res["copies"] == 6 and res["private_records"] == 40
    saved = json.loads((out / "audit_canary.json").read_text())
    assert saved["synthetic"] == res["synthetic"]
    assert (out / "run" / "private" / "eval" / "audit_canary.json").is_file()
    assert "indices" not in json.dumps(saved)


def test_canary_cli_json_and_bad_copies(config, tmp_path, monkeypatch):
    cfg, _ = config
    calls: list = []
    monkeypatch.setattr("dpsynth.api.run_generation", _fake_generation(calls, copy_rows=0))
    from dpsynth.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["audit", "canary", str(cfg), "--copies", "3", "--canary", CANARY,
                              "--output", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["synthetic"] == {"exact": 0, "near": 0, "outputs": 1, "threshold": 0.8,
                                "best_similarity": out["synthetic"]["best_similarity"]}
    res = runner.invoke(app, ["audit", "canary", str(cfg), "--copies", "41",
                              "--output", str(tmp_path / "b")])
    assert res.exit_code == 2 and "exceeds the number of private records (40)" in res.output


def test_write_canary_data_keeps_jsonl_format(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"body": f"note {i}", "y": i % 2}) + "\n"
                           for i in range(10)))
    path, n = write_canary_data(src, "body", tmp_path / "priv", "SECRET 99", 2, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert n == 10 and path.suffix == ".jsonl"
    assert sum("SECRET 99" in r["body"] for r in rows) == 2
    assert [r["y"] for r in rows] == [i % 2 for i in range(10)]


def test_canary_report_rejects_non_runs(tmp_path):
    from dpsynth.eval.common import EvalInputError

    with pytest.raises(EvalInputError, match="not a dpsynth run folder"):
        canary_report(tmp_path, CANARY, 3)
