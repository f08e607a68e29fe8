"""Cross-run budget ledger: refusal, crash counting, concurrency, CLI."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.privacy import (
    BudgetLedger,
    BudgetRefusedError,
    PrivacyConfigError,
    dataset_fingerprint,
    default_ledger_path,
)


def test_fingerprint() -> None:
    a = dataset_fingerprint(["ab", "c"])
    assert a == dataset_fingerprint(["ab", "c"]) and len(a) == 64
    assert a != dataset_fingerprint(["a", "bc"])  # boundaries matter
    assert a != dataset_fingerprint(["c", "ab"])  # order matters
    assert a != dataset_fingerprint(["ab", "c"], extra="labels:1,0")


def test_reserve_refuse_settle(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    ds = dataset_fingerprint(["x"])
    led.reserve(ds, "run1", 1.0, 1e-6, total_epsilon=3.0, total_delta=1e-5)
    led.reserve(ds, "run2", 1.5, 1e-6, total_epsilon=3.0, total_delta=1e-5)
    assert led.spent(ds) == pytest.approx((2.5, 2e-6))
    with pytest.raises(BudgetRefusedError) as err:
        led.reserve(ds, "run3", 1.0, 1e-6, total_epsilon=3.0, total_delta=1e-5)
    msg = str(err.value)
    assert "spent so far epsilon=2.5" in msg and "requested epsilon=1" in msg
    assert "total allowed epsilon=3.0" in msg and "Lower" in msg
    assert [e["run_id"] for e in led.entries(ds)] == ["run1", "run2"]  # refused run not recorded
    # run1 crashed (never settled): its reservation keeps counting. run2 settles lower.
    led.settle("run2", 0.9, 1e-6)
    assert led.spent(ds) == pytest.approx((1.9, 2e-6))
    led.reserve(ds, "run3", 1.0, 1e-6, total_epsilon=3.0, total_delta=1e-5)
    # re-reserving the same (resumed) run replaces its reservation, no double count
    led.reserve(ds, "run3", 1.1, 1e-6, total_epsilon=3.0, total_delta=1e-5)
    assert led.spent(ds) == pytest.approx((3.0, 3e-6))
    # delta total is enforced too; other datasets are independent
    with pytest.raises(BudgetRefusedError, match="delta"):
        led.reserve(ds, "run4", 0.0, 1e-4, total_epsilon=None, total_delta=1e-5)
    led.reserve("other", "run1", 5.0, 1e-5, total_epsilon=5.0, total_delta=None)
    assert led.spent("other") == (5.0, 1e-5)
    with pytest.raises(BudgetRefusedError, match="settled"):
        led.reserve(ds, "run2", 0.1, 0.0, None, None)
    with pytest.raises(PrivacyConfigError, match="epsilon"):
        led.reserve(ds, "run9", -1.0, 0.0, None, None)
    with pytest.raises(PrivacyConfigError, match="no reservation"):
        led.settle("ghost", 1.0, 0.0)
    # the file is plain JSON
    data = json.loads((tmp_path / "ledger.json").read_text())
    assert len(data["entries"]) == 4


def test_default_path_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "l.json"))
    assert default_ledger_path() == tmp_path / "l.json"
    assert BudgetLedger().path == tmp_path / "l.json"
    monkeypatch.delenv("DPSYNTH_LEDGER")
    assert default_ledger_path() == Path.home() / ".dpsynth" / "ledger.json"


def _reserve_worker(path: str, i: int, q: mp.Queue) -> None:
    try:
        BudgetLedger(Path(path)).reserve(
            "ds", f"run{i}", 0.1, 0.0, total_epsilon=0.5, total_delta=None
        )
        q.put(True)
    except BudgetRefusedError:
        q.put(False)


def test_concurrent_reservations(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reserve_worker, args=(path, i, q)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = [q.get(timeout=5) for _ in procs]
    assert sum(results) == 5  # exactly the budget: no lost update, no over-commit
    led = BudgetLedger(Path(path))
    assert len(led.entries("ds")) == 5
    assert led.spent("ds")[0] == pytest.approx(0.5)


def test_budget_show_cli(tmp_path: Path) -> None:
    from dpsynth.cli import app

    path = tmp_path / "ledger.json"
    led = BudgetLedger(path)
    led.reserve("abcdef1234567890", "run-a", 1.0, 1e-6, None, None)
    led.settle("run-a", 0.8, 1e-6)
    led.reserve("abcdef1234567890", "run-b", 2.0, 1e-6, None, None)
    runner = CliRunner()
    res = runner.invoke(app, ["budget", "show", "--ledger", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    (ds,) = out["datasets"]
    assert ds["epsilon"] == pytest.approx(2.8) and len(ds["runs"]) == 2
    res = runner.invoke(app, ["budget", "show", "--ledger", str(path)])
    assert res.exit_code == 0 and "run-a" in res.stdout and "reserved" in res.stdout
    path.write_text("{broken")
    res = runner.invoke(app, ["budget", "show", "--ledger", str(path)])
    assert res.exit_code == 2 and "not valid JSON" in res.output and "Traceback" not in res.output
