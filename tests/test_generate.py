"""`dpsynth generate` end to end on the real offline models: validation before any model
loads, a real Aug-PE run killed after a release and resumed, and the release contents."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dpsynth.api import run_generation
from dpsynth.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny-aug-pe.yaml"


def _config(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(autouse=True)
def _ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"method": "magic_pe"}, "unknown method 'magic_pe'"),
        ({"data.labels": ["no_such_column"]}, "no_such_column"),
        ({"synthesis.samples": 5000, "synthesis.max_candidates": 1000}, "max_candidates"),
        ({"privacy.epsilon": 0}, "use method 'zero_shot'"),
        ({"synthesis.samples": 2}, "fewer than the"),
        ({"data.labels": ["urgency"]}, "not among data.labels"),
    ],
)
def test_bad_config_fails_before_any_model_loads(tmp_path, changes, message):
    out = tmp_path / "run"
    with pytest.raises(Exception) as info:
        run_generation(_config(tmp_path, **changes), out, progress=False)
    assert message in str(info.value)
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert "loading generator" not in log and "loading embedder" not in log


def test_existing_run_folder_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match="--resume"):
        run_generation(_config(tmp_path), out, progress=False)


def _cache_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("select count(*) from generations").fetchone()[0]


def _releases(run: Path) -> dict[str, dict]:
    lines = (run / "private" / "releases" / "releases.jsonl").read_text().splitlines()
    return {json.loads(line)["key"]: json.loads(line) for line in lines if line.strip()}


@pytest.mark.models
def test_aug_pe_killed_after_a_release_resumes_without_redraw_or_repeat(tmp_path):
    # the tiny example with the fewest samples it allows (one per department): every step
    # still runs (label counts, two vote rounds, variations, the release); short texts in a
    # declared public length band (none refused as too short, so none generated twice)
    config = _config(tmp_path, **{"synthesis.samples": 6, "synthesis.min_words": 4,
                                  "synthesis.max_words": 12,
                                  "generators": [{"model": "smollm2", "max_new_tokens": 16,
                                                  "batch_size": 16}]})
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "dpsynth.cli", "generate", str(config), "--output", str(run),
           "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    store = run / "private" / "releases" / "releases.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if store.is_file() and "iter0/votes" in store.read_text():
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stdout.read().decode()[-2000:]
    assert json.loads((run / "run.json").read_text())["status"] == "running"
    before = _releases(run)
    assert "label_counts" in before and "iter0/votes" in before
    cache = run / "private" / "llm-cache.sqlite"
    rows_before = _cache_rows(cache)
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert any(e.get("status") == "reserved" for e in ledger["entries"])  # the crash counts

    done = subprocess.run(cmd + ["--resume", "--json"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    after = _releases(run)
    for key in before:  # stored noise came back, never redrawn
        assert after[key]["value"] == before[key]["value"]
    assert set(after) == {"label_counts", "iter0/votes", "iter1/votes"}
    # every call the resumed process paid for was new: no request was sent twice
    assert summary["llm_calls"] == _cache_rows(cache) - rows_before

    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["target_epsilon"] == 4.0 and privacy["noise"] == "secure"  # the default
    assert privacy["epsilon"] <= 4.0 + 1e-6 and privacy["epsilon"] > 3.9  # calibrated, no more
    from dpsynth.privacy import Accountant, DiscreteGaussianEvent

    # label counts and two k = 1 vote rounds: discrete Gaussian counts, shift profile (1,)
    acc = Accountant("pld")
    acc.add(DiscreteGaussianEvent(sigma=privacy["noise_multiplier"], sensitivity=1.0, count=3,
                                  shifts=(1,)))
    assert privacy["epsilon"] == pytest.approx(acc.epsilon(1e-5), rel=1e-6)

    rows = [json.loads(line) for line in
            (run / "release" / "synthetic.jsonl").read_text().splitlines()]
    assert 1 <= len(rows) <= 6 and all(r["text"] and r["labels"]["department"] for r in rows)
    stats = [json.loads(line) for line in (run / "stats.jsonl").read_text().splitlines()]
    assert [s["iteration"] for s in stats] == [1, 2]
    assert all(s["noise_sigma"] == pytest.approx(privacy["noise_multiplier"]) for s in stats)
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["attempts"] == 2
    assert oct((run / "private").stat().st_mode)[-3:] == "700"
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert [e["status"] for e in ledger["entries"]] == ["settled"]
    # per-iteration pools are released; eval draws the FID curve from them, the report plots it
    assert sorted(p.name for p in (run / "release" / "iterations").iterdir()) == \
        ["iter1.jsonl", "iter2.jsonl"]
    from dpsynth.eval.report import write_report
    from dpsynth.eval.suite import EvalOptions, evaluate_run

    ev, _ = evaluate_run(run, options=EvalOptions(with_audits=False, with_mauve=False))
    curve = ev["fidelity"]["per_iteration"]
    assert [c["iteration"] for c in curve] == [1, 2]
    assert all(isinstance(c["fid"], float) and c["fid"] > 0 for c in curve)
    html = write_report(run).read_text()
    assert "FID per iteration" in html and html.count("data:image/png;base64,") >= 3
    # no private text leaks into the release or the log
    private_texts = (run / "private" / "demo-data" / "private.csv").read_text()
    released = (run / "release" / "synthetic.jsonl").read_text() + (run / "log.txt").read_text()
    import pandas as pd

    for text in pd.read_csv(run / "private" / "demo-data" / "private.csv")["text"][:50]:
        assert text not in released
    assert private_texts
