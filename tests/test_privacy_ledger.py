"""Cross-run budget ledger: refusal, crash counting, concurrency, CLI."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.data import fingerprint_columns
from dpsynth.privacy import (
    BudgetLedger,
    BudgetRefusedError,
    PrivacyConfigError,
    default_ledger_path,
)


def dataset_fingerprint(texts: list[str], labels: list[str] | None = None) -> str:
    """The one dataset fingerprint (dpsynth.data), over texts and an optional label column."""
    if labels is None:
        return fingerprint_columns(texts, [], [], None)
    return fingerprint_columns(texts, [labels], ["label"], None)


def test_fingerprint() -> None:
    a = dataset_fingerprint(["ab", "c"])
    assert a == dataset_fingerprint(["ab", "c"]) and len(a) == 64
    assert a != dataset_fingerprint(["a", "bc"])  # boundaries matter
    assert a != dataset_fingerprint(["c", "ab"])  # order matters
    assert a != dataset_fingerprint(["ab", "c"], labels=["1", "0"])


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


# ------------------------------------------------------------------ keyed fingerprints


def test_dataset_id_is_keyed_and_stable(tmp_path: Path) -> None:
    from dpsynth.privacy import keyed_fingerprint

    raw = dataset_fingerprint(["x", "y"])
    led = BudgetLedger(tmp_path / "a" / "ledger.json")
    ds = led.dataset_id(raw)
    assert ds != raw and len(ds) == 64
    assert led.dataset_id(raw) == ds == BudgetLedger(led.path).dataset_id(raw)
    key = led.key_path
    assert key.is_file() and key.stat().st_mode & 0o777 == 0o600
    assert keyed_fingerprint(raw, bytes.fromhex(key.read_text().strip())) == ds
    assert BudgetLedger(tmp_path / "b" / "ledger.json").dataset_id(raw) != ds  # another key
    key.write_text("zz\n")
    with pytest.raises(PrivacyConfigError, match="key file is corrupt"):
        led.dataset_id(raw)


# ------------------------------------------------------------------ seeds, sticky budgets, non-DP


def test_reused_seed_is_refused_on_the_same_dataset(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    led.reserve("ds", "run1", 1.0, 0.0, None, None, noise_seed=7)
    led.reserve("ds", "run1", 1.0, 0.0, None, None, noise_seed=7)  # resume: same run is fine
    with pytest.raises(BudgetRefusedError, match="identical noise"):
        led.reserve("ds", "run2", 1.0, 0.0, None, None, noise_seed=7)
    led.reserve("ds", "run2", 1.0, 0.0, None, None, noise_seed=8)
    led.reserve("other", "run3", 1.0, 0.0, None, None, noise_seed=7)  # another dataset
    led.reserve("ds", "run4", 1.0, 0.0, None, None)  # secure noise: no seed
    assert all("seed" not in e and "noise_seed" not in e for e in led.entries())  # tag only
    assert all(len(e["seed_tag"]) == 64 for e in led.entries() if "seed_tag" in e)


def test_dataset_budget_is_stored_and_sticks(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    led.reserve("ds", "run1", 4.0, 1e-6, total_epsilon=6.0, total_delta=None)
    assert led.budget("ds")["total_epsilon"] == 6.0
    # issue 16: the next config does not repeat the cap -> still refused (the old total was 8)
    with pytest.raises(BudgetRefusedError, match="total allowed epsilon=6.0"):
        led.reserve("ds", "run2", 4.0, 1e-6, total_epsilon=None, total_delta=None)
    with pytest.raises(BudgetRefusedError):  # a config cannot loosen it
        led.reserve("ds", "run2", 4.0, 1e-6, total_epsilon=50.0, total_delta=None)
    assert led.budget("ds")["total_epsilon"] == 6.0
    led.reserve("ds", "run2", 1.0, 1e-6, total_epsilon=None, total_delta=None)
    # only an explicit budget set changes it
    led.set_budget("ds", 10.0, None)
    assert led.budget("ds")["source"] == "budget set"
    led.reserve("ds", "run3", 4.0, 1e-6, None, None)
    assert led.spent("ds") == pytest.approx((9.0, 3e-6))
    with pytest.raises(PrivacyConfigError, match="both"):
        led.set_budget("ds", None, None)
    assert led.budget("nothing") is None


def test_runs_without_a_classical_guarantee_are_recorded(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    led.reserve("ds", "dp1", 1.0, 1e-6, None, None)
    led.record_run("ds", "inf1", "none", method="aug_pe")
    led.record_run("ds", "secpe1", "secret-protection", p=1e-4, r=1e-3)
    by_run = {e["run_id"]: e for e in led.entries("ds")}
    assert by_run["inf1"]["guarantee"] == "none" and by_run["inf1"]["status"] == "recorded"
    assert by_run["secpe1"]["details"] == {"p": 1e-4, "r": 1e-3}
    assert led.spent("ds") == pytest.approx((1.0, 1e-6))  # they add nothing to the sums
    with pytest.raises(PrivacyConfigError, match="guarantee"):
        led.record_run("ds", "x", "dp")
    with pytest.raises(PrivacyConfigError, match="DP reservation"):
        led.record_run("ds", "dp1", "none")


# ------------------------------------------------------------------ CLI: show errors, set


def _show(path: Path, *extra: str):
    from dpsynth.cli import app

    return CliRunner().invoke(app, ["budget", "show", "--ledger", str(path), *extra],
                              env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{broken", "not valid JSON"),
        ('{"entries": 3}', "no 'entries' list"),
        ('{"entries": [{"dataset": "d"}]}', "entry 0"),
        ('{"entries": [], "budgets": [1]}', "budgets"),
    ],
)
def test_budget_show_corrupt_ledger_exit_2(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(content)
    for extra in ((), ("--json",)):
        res = _show(path, *extra)
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)


def test_budget_show_directory_and_unreadable_exit_2(tmp_path: Path) -> None:
    res = _show(tmp_path)
    assert res.exit_code == 2 and "is a directory" in res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit)
    blocked = tmp_path / "file"
    blocked.write_text("x")
    res = _show(blocked / "ledger.json")  # parent is a file: cannot be created or read
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output


def test_budget_show_lists_budgets_and_non_dp_runs(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    led = BudgetLedger(path)
    led.reserve("abcdef1234567890", "run-a", 1.0, 1e-6, 6.0, None)
    led.record_run("abcdef1234567890", "run-inf", "none")
    out = json.loads(_show(path, "--json").stdout)
    (ds,) = out["datasets"]
    assert ds["total_epsilon"] == 6.0 and ds["runs_without_dp_guarantee"] == 1
    res = _show(path)
    assert res.exit_code == 0 and "1 without DP" in res.stdout and "of 6" in res.stdout


def test_budget_set_cli(tmp_path: Path) -> None:
    from dpsynth.cli import app

    path = tmp_path / "ledger.json"
    data = tmp_path / "data.csv"
    data.write_text("text,label\nhello there,a\ngeneral kenobi,b\n")
    runner = CliRunner()
    res = runner.invoke(app, ["budget", "set", "--data", str(data), "--label", "label",
                              "--total-epsilon", "3", "--total-delta", "1e-5",
                              "--ledger", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    from dpsynth.data import load_dataset

    raw = load_dataset(data, "text", ["label"]).fingerprint()
    assert out["dataset"] == BudgetLedger(path).dataset_id(raw) != raw
    assert out["total_epsilon"] == 3.0 and out["total_delta"] == 1e-5
    assert BudgetLedger(path).budget(out["dataset"])["total_epsilon"] == 3.0
    for argv, needle in [
        (["--total-epsilon", "1"], "exactly one"),
        (["--dataset", "x", "--data", str(data), "--total-epsilon", "1"], "exactly one"),
        (["--dataset", "x"], "--total-epsilon"),
        (["--dataset", "x", "--total-epsilon", "-1"], "--total-epsilon"),
        (["--dataset", "x", "--total-delta", "2"], "--total-delta"),
        (["--data", str(tmp_path / "missing.csv"), "--total-epsilon", "1"], "missing.csv"),
    ]:
        res = runner.invoke(app, ["budget", "set", *argv, "--ledger", str(path)])
        assert res.exit_code == 2 and needle in res.output, (argv, res.output)
        assert "Traceback" not in res.output
