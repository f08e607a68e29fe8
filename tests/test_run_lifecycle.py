"""The life of a run as run.json tells it: refusals leave nothing behind, a stopped run says
why, a finished run carries no stale error (issue 16: truthful state, clean refusals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dpsynth.api import run_generation
from dpsynth.cli import app
from dpsynth.config import ConfigError
from dpsynth.run_folder import RunDir

REPO = Path(__file__).resolve().parents[1]


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    path = tmp_path / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def _bad_data_config(tmp_path: Path) -> Path:
    data = tmp_path / "private.csv"
    pd.DataFrame({"body": ["a perfectly fine message about a visit"]}).to_csv(data, index=False)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"method: aug_pe\ndata: {{path: {data}}}\n")
    return cfg


def test_data_refusal_leaves_no_run_folder_and_no_resume_advice(tmp_path, ledger):
    cfg = _bad_data_config(tmp_path)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["generate", str(cfg), "-o", str(out)])
    assert result.exit_code == 2
    text = _flat(result.output)
    assert "private.csv" in text and "'text'" in text
    assert "--resume" not in text  # a resume cannot help a refusal
    assert not out.exists()


def test_refusal_keeps_a_pre_existing_empty_folder(tmp_path, ledger):
    cfg = _bad_data_config(tmp_path)
    out = tmp_path / "empty"
    out.mkdir()
    with pytest.raises(Exception, match="private.csv"):
        run_generation(cfg, out, progress=False)
    assert out.is_dir() and list(out.iterdir()) == []


def test_non_run_folder_with_files_is_refused_untouched(tmp_path, ledger):
    cfg = _bad_data_config(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("the user's own file")
    with pytest.raises(ConfigError, match="not a dpsynth run folder"):
        run_generation(cfg, out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    result = CliRunner().invoke(app, ["generate", str(cfg), "-o", str(out)])
    assert result.exit_code == 2 and "not empty" in _flat(result.output)


def test_end_attempt_history_and_cleared_error(tmp_path):
    run = RunDir(tmp_path / "r")
    run.create("method: aug_pe\n", "aug_pe")
    run.end_attempt("failed", error="GenerationError", llm_calls=30)
    run.update_meta(status="running", attempts=2)
    meta = run.end_attempt("finished", llm_calls=5)
    assert meta["status"] == "finished" and meta["error"] is None and meta["reason"] is None
    assert [h["status"] for h in meta["history"]] == ["failed", "finished"]
    assert meta["llm_calls_paid"] == 35 and meta["finished"] is not None


_SLOW_RUN = """
import sys, time
sys.path.insert(0, {tests!r})
from fakes import FakeEmbedder, FakeGenerator
from dpsynth.api import run_generation

class Slow(FakeGenerator):
    def generate(self, requests, **kw):
        print("generating", flush=True)
        time.sleep(60)
        return super().generate(requests, **kw)

run_generation({cfg!r}, {out!r}, progress=False, generators=[Slow()], embedder=FakeEmbedder())
"""


@pytest.mark.skipif(not (REPO / "tests" / "fakes.py").exists(), reason="needs tests/fakes.py")
def test_sigterm_ends_the_run_with_a_true_status(tmp_path, ledger):
    data = tmp_path / "private.csv"
    pd.DataFrame({"text": [f"message number {i} about a clinic visit" for i in range(20)]}
                 ).to_csv(data, index=False)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"method: aug_pe\ndata: {{path: {data}}}\n"
                   "synthesis: {samples: 4, iterations: 1}\n")
    out = tmp_path / "run"
    script = _SLOW_RUN.format(tests=str(REPO / "tests"), cfg=str(cfg), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "DPSYNTH_LEDGER": str(ledger)})
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while "generating" not in line and time.monotonic() < deadline and line:
        line = proc.stdout.readline()
    assert "generating" in line, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["reason"] == "SIGTERM"
    assert meta["history"][-1]["status"] == "interrupted"


def test_resume_of_a_run_still_running_elsewhere_is_refused_untouched(tmp_path, ledger):
    run = RunDir(tmp_path / "r")
    run.create("method: aug_pe\n", "aug_pe")
    store = run.private / "releases"
    store.mkdir(parents=True)
    (store / ".lock").touch()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time; fh = open(sys.argv[1], 'r+'); "
         "fcntl.flock(fh, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(store / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = run.meta_path.read_bytes()
        with pytest.raises(ConfigError, match="still running"):
            run_generation(run.config_path, run.root, resume=True, progress=False)
        assert run.meta_path.read_bytes() == before
    finally:
        holder.kill()
        holder.wait()


def test_resume_after_a_kill_before_the_ledger_entry_reserves_then(tmp_path, ledger):
    """Killed after run.json was written but before the ledger reservation: --resume must
    reserve (and then settle) instead of failing on a missing reservation."""
    from dpsynth.config import dump_config, parse_config
    from dpsynth.privacy import BudgetLedger
    from fakes import FakeEmbedder, FakeGenerator

    data = tmp_path / "private.csv"
    pd.DataFrame({"text": [f"message number {i} about a clinic visit" for i in range(30)]}
                 ).to_csv(data, index=False)
    cfg = parse_config({"method": "aug_pe", "data": {"path": str(data)},
                        "synthesis": {"samples": 4, "iterations": 1}})
    run = RunDir(tmp_path / "run")
    run_id = run.create(dump_config(cfg), "aug_pe")["run_id"]  # the state a kill leaves
    run_generation(cfg, run.root, resume=True, progress=False,
                   generators=[FakeGenerator()], embedder=FakeEmbedder())
    (entry,) = [e for e in BudgetLedger(ledger).entries() if e["run_id"] == run_id]
    assert entry["status"] == "settled"
    assert json.loads(run.meta_path.read_text())["status"] == "finished"


def test_set_on_resume_is_refused_not_ignored(tmp_path, ledger):
    run = RunDir(tmp_path / "r")
    missing = tmp_path / "gone.csv"  # the resumed run stops at its data, before any model
    run.create(f"method: aug_pe\ndata: {{path: {missing}}}\nprivacy: {{epsilon: 4.0}}\n",
               "aug_pe")
    with pytest.raises(ConfigError, match="with --set .* changes privacy.epsilon: a resumed run"):
        run_generation(run.config_path, run.root, resume=True, progress=False,
                       overrides={"privacy.epsilon": 8})
    # repeating the stored value is allowed (it changes nothing): the run goes on to its data
    with pytest.raises(Exception, match="gone.csv"):
        run_generation(run.config_path, run.root, resume=True, progress=False,
                       overrides={"privacy.epsilon": 4.0})


def test_a_method_section_is_locked_on_resume(tmp_path, ledger):
    """A method's own section (validated by its model through the registry) is part of the
    config the run stores and digests: a resume refuses a changed wasp.top_q, by --set and in
    the CONFIG argument, and accepts the stored value repeated."""
    import yaml

    from dpsynth.config import parse_config
    from dpsynth.resume import locked_fields
    from dpsynth.runner import open_run

    raw = {"method": "wasp", "data": {"path": str(tmp_path / "gone.csv")},
           "wasp": {"top_q": 4}}
    cfg = parse_config(raw)
    assert locked_fields(cfg.model_dump(mode="json"))["wasp.top_q"] == 4
    run, _, _ = open_run(cfg, tmp_path / "r", resume=False)
    assert yaml.safe_load(run.config_path.read_text())["wasp"]["federated"]["parties"] == 0
    with pytest.raises(ConfigError, match="changes wasp.top_q"):
        open_run(None, run.root, resume=True, overrides={"wasp.top_q": 3})
    with pytest.raises(ConfigError, match="changes wasp.top_q"):
        open_run(parse_config({**raw, "wasp": {"top_q": 3}}), run.root, resume=True)
    _, again, _ = open_run(parse_config(raw), run.root, resume=True)
    assert again.wasp.top_q == 4
