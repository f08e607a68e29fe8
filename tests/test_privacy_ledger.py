"""The cross-run budget ledger of data sources: matching (name, content, records, overlap),
refusal, crash counting, concurrency, failing closed on a lost or wrong key, version-2
migration, the CLI. The bypasses through whole runs are in test_budget_bypass.py."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.data import fingerprint_columns
from dpsynth.identity import DataIdentity, containment, text_sketch
from dpsynth.privacy import (
    BudgetLedger,
    BudgetRefusedError,
    PrivacyConfigError,
    default_ledger_path,
    keyed_fingerprint,
)
from dpsynth.privacy.ledger import DEFAULT_TOTAL_EPSILON, LedgerUnusableError

TEXTS = [f"record number {i} about some private matter" for i in range(300)]


def dataset_fingerprint(texts: list[str], labels: list[str] | None = None) -> str:
    """The one records fingerprint (dpsynth.data), over texts and an optional label column."""
    if labels is None:
        return fingerprint_columns(texts, [], [], None)
    return fingerprint_columns(texts, [labels], ["label"], None)


def ident(led: BudgetLedger, texts: list[str] = TEXTS, name: str = "/data/a.csv",
          content: str | None = None) -> DataIdentity:
    """A data identity as the runner builds it (content: the bytes of a file of the texts)."""
    raw = content or hashlib.sha256("\n".join(texts).encode()).hexdigest()
    return DataIdentity(name, raw, dataset_fingerprint(texts), text_sketch(texts,
                                                                          led.sketch_key()))


def test_fingerprint() -> None:
    a = dataset_fingerprint(["ab", "c"])
    assert a == dataset_fingerprint(["ab", "c"]) and len(a) == 64
    assert a != dataset_fingerprint(["a", "bc"])  # boundaries matter
    assert a != dataset_fingerprint(["c", "ab"])  # order matters
    assert a != dataset_fingerprint(["ab", "c"], labels=["1", "0"])


def test_sketch_containment_estimates_overlap() -> None:
    key = b"k" * 32
    big = [f"t{i}" for i in range(20000)]
    full = text_sketch(big, key)
    assert len(full) == 1024 and list(full) == sorted(full)
    share, n = containment(text_sketch(big[:2000], key), full)  # a 10 % subset
    assert share == 1.0 and n >= 50
    share, _ = containment(text_sketch([f"u{i}" for i in range(5000)], key), full)
    assert share == 0.0  # unrelated texts
    half = big[:5000] + [f"u{i}" for i in range(5000)]
    share, n = containment(text_sketch(half, key), full)
    assert 0.4 < share < 0.6 and n > 300
    assert text_sketch(big, b"j" * 32) != full  # keyed


def test_reserve_refuse_settle(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    d = ident(led)
    (src,) = [m.source for m in led.reserve(d, "run1", 1.0, 1e-6, 3.0, 1e-5).sources]
    led.reserve(d, "run2", 1.5, 1e-6, 3.0, 1e-5)
    assert led.spent(src) == pytest.approx((2.5, 2e-6))
    with pytest.raises(BudgetRefusedError) as err:
        led.reserve(d, "run3", 1.0, 1e-6, 3.0, 1e-5)
    msg = str(err.value)
    assert "spent so far epsilon=2.5" in msg and "asks epsilon=1" in msg
    assert "total is epsilon=3" in msg and "/data/a.csv" in msg
    assert [e["run_id"] for e in led.entries(src)] == ["run1", "run2"]  # refused: not recorded
    # run1 crashed (never settled): its reservation keeps counting. run2 settles lower.
    led.settle("run2", 0.9, 1e-6)
    assert led.spent(src) == pytest.approx((1.9, 2e-6))
    led.reserve(d, "run3", 1.0, 1e-6, 3.0, 1e-5)
    led.reserve(d, "run3", 1.1, 1e-6, 3.0, 1e-5)  # a resume replaces its reservation
    assert led.spent(src) == pytest.approx((3.0, 3e-6))
    with pytest.raises(BudgetRefusedError, match="delta"):
        led.reserve(d, "run4", 0.0, 1e-4, None, 1e-5)
    with pytest.raises(BudgetRefusedError, match="settled"):
        led.reserve(d, "run2", 0.1, 0.0)
    with pytest.raises(PrivacyConfigError, match="epsilon"):
        led.reserve(d, "run9", -1.0, 0.0)
    with pytest.raises(PrivacyConfigError, match="no reservation"):
        led.settle("ghost", 1.0, 0.0)
    # spending past the reservation is recorded as it is, then raised
    with pytest.raises(BudgetRefusedError, match="more than it reserved"):
        led.settle("run3", 1.5, 1e-6)
    assert led.spent(src)[0] == pytest.approx(1.0 + 0.9 + 1.5)
    data = json.loads((tmp_path / "ledger.json").read_text())  # plain JSON, no raw digest
    assert data["version"] == 3 and len(data["entries"]) == 3
    assert d.records not in json.dumps(data) and d.content not in json.dumps(data)
    assert (tmp_path / "ledger.json.bak").is_file()  # the ledger before its last change


def test_a_source_is_one_budget_by_name_content_records_and_overlap(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    first = led.reserve(ident(led), "run1", 2.0, 1e-6, total_epsilon=5.0)
    (src,) = [m.source for m in first.sources]
    assert first.sources[0].how == [] and "new data source" in first.describe()
    cases = {
        # the same path, one record added: a new version of the source
        "version": ident(led, TEXTS + ["one more"]),
        # a byte copy at another path
        "copy": ident(led, name="/elsewhere/copy.csv"),
        # the first 100 records (as data.limit reads them), other columns: the records differ
        "subset": ident(led, TEXTS[:100], name="/tmp/first100.jsonl"),
        # one record removed, converted to another format, at another path
        "edited": ident(led, TEXTS[1:], name="/tmp/b.parquet"),
    }
    expect = {"version": ["name", "overlap"], "copy": ["content", "records", "overlap"],
              "subset": ["overlap"], "edited": ["overlap"]}
    for case, d in cases.items():
        charge = led.resolve(d)
        assert [m.source for m in charge.sources] == [src], case
        assert charge.sources[0].how == expect[case], case
    assert led.resolve(cases["version"]).sources[0].new_version
    # each is charged to the one budget: 2 spent of 5, so 4 more is refused
    with pytest.raises(BudgetRefusedError, match="total is epsilon=5"):
        led.reserve(cases["edited"], "run2", 4.0, 1e-6)
    led.reserve(cases["copy"], "run2", 1.0, 1e-6)
    assert set(led.source(src)["names"]) == {"/data/a.csv", "/elsewhere/copy.csv"}
    led.reserve(cases["version"], "run3", 1.0, 1e-6)
    assert len(led.source(src)["versions"]) == 2
    assert led.spent(src)[0] == pytest.approx(4.0)
    # unrelated data is another source
    other = led.reserve(ident(led, [f"x{i}" for i in range(50)], name="/data/other.csv"),
                        "run4", 5.0, 1e-6)
    assert other.sources[0].source != src


def test_a_run_over_two_sources_is_charged_to_both(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    a = [f"a{i}" for i in range(200)]
    b = [f"b{i}" for i in range(200)]
    sa = led.reserve(ident(led, a, name="/a.csv"), "r1", 1.0, 0.0, 2.0).sources[0].source
    sb = led.reserve(ident(led, b, name="/b.csv"), "r2", 1.5, 0.0, 2.0).sources[0].source
    both = ident(led, a + b, name="/a.csv")  # a's path, now holding a and b
    assert {m.source for m in led.resolve(both).sources} == {sa, sb}
    with pytest.raises(BudgetRefusedError, match="/b.csv"):  # b has only 0.5 left
        led.reserve(both, "r3", 1.0, 0.0)
    assert led.entries(sa) == led.entries(sa)[:1]  # refused everywhere: nothing written
    led.reserve(both, "r3", 0.5, 0.0)
    assert led.spent(sa)[0] == pytest.approx(1.5) and led.spent(sb)[0] == pytest.approx(2.0)
    led.settle("r3", 0.4, 0.0)
    assert led.spent(sa)[0] == pytest.approx(1.4) and led.spent(sb)[0] == pytest.approx(1.9)


def test_default_path_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "l.json"))
    assert default_ledger_path() == tmp_path / "l.json"
    assert BudgetLedger().path == tmp_path / "l.json"
    monkeypatch.delenv("DPSYNTH_LEDGER")
    assert default_ledger_path() == Path.home() / ".dpsynth" / "ledger.json"


def _reserve_worker(path: str, i: int, q: mp.Queue) -> None:
    led = BudgetLedger(Path(path))
    try:
        led.reserve(ident(led), f"run{i}", 0.1, 0.0, total_epsilon=0.5)
        q.put(True)
    except BudgetRefusedError:
        q.put(False)


def test_concurrent_reservations(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    led = BudgetLedger(Path(path))
    src = led.reserve(ident(led), "run-first", 0.1, 0.0, total_epsilon=0.5).sources[0].source
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reserve_worker, args=(path, i, q)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = [q.get(timeout=5) for _ in procs]
    assert sum(results) == 4  # exactly the budget: no lost update, no over-commit
    assert len(led.entries(src)) == 5 and len(led.sources()) == 1
    assert led.spent(src)[0] == pytest.approx(0.5)


# ------------------------------------------------------------------ failing closed


def test_a_lost_key_fails_closed_and_rekey_keeps_spending_by_name(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    led = BudgetLedger(path)
    d = ident(led)
    src = led.reserve(d, "run1", 4.0, 1e-6, total_epsilon=5.0).sources[0].source
    key = led.key_path.read_bytes()
    led.key_path.rename(tmp_path / "moved.key")
    for call in (lambda: led.reserve(d, "run2", 4.0, 1e-6), lambda: led.sources(),
                 lambda: led.sketch_key(), lambda: led.set_budget(src, 9.0, None)):
        with pytest.raises(LedgerUnusableError, match="ledger key is missing") as err:
            call()
        assert "budget rekey" in str(err.value) and "backup" in str(err.value)
    assert not led.key_path.exists()  # nothing regenerated silently
    led.key_path.write_text("zz\n")  # an unreadable key
    with pytest.raises(LedgerUnusableError, match="key is corrupt"):
        led.sources()
    led.key_path.write_text(hashlib.sha256(b"another").hexdigest() + "\n")  # another key
    with pytest.raises(LedgerUnusableError, match="is not the key of"):
        led.reserve(d, "run2", 4.0, 1e-6)
    led.key_path.write_bytes(key)  # restored: works again, and the cap still holds
    with pytest.raises(BudgetRefusedError, match="spent so far epsilon=4"):
        led.reserve(d, "run2", 4.0, 1e-6)
    with pytest.raises(PrivacyConfigError, match="nothing to re-key"):
        led.rekey()
    led.key_path.unlink()
    assert led.rekey() == {"sources": 1, "versions_dropped": 1}
    # the spending is kept by name: the same path is still charged to the old budget
    with pytest.raises(BudgetRefusedError, match="spent so far epsilon=4"):
        BudgetLedger(path).reserve(ident(led), "run2", 4.0, 1e-6)
    assert BudgetLedger(path).spent(src)[0] == pytest.approx(4.0)


def test_a_missing_or_corrupt_ledger_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    led = BudgetLedger(path)
    led.reserve(ident(led), "run1", 1.0, 0.0)
    path.rename(tmp_path / "gone.json")  # the ledger lost, its key kept
    with pytest.raises(LedgerUnusableError, match="ledger is missing but its key"):
        led.reserve(ident(led), "run2", 1.0, 0.0)
    path.write_text("{broken")
    with pytest.raises(LedgerUnusableError, match=r"not valid JSON.*ledger\.json\.bak"):
        led.sources()
    # an empty ledger whose key was never written (a crash in between) gets a new key
    fresh = BudgetLedger(tmp_path / "new" / "ledger.json")
    fresh.sources()  # reading creates nothing
    assert not fresh.path.exists() and not fresh.key_path.exists()
    fresh.sketch_key()
    fresh.key_path.unlink()
    assert len(fresh.sketch_key()) == 32


def test_a_version_2_ledger_carries_over(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    BudgetLedger(path).sketch_key()  # a key
    key = bytes.fromhex(BudgetLedger(path).key_path.read_text().strip())
    old = keyed_fingerprint(dataset_fingerprint(TEXTS), key)
    path.write_text(json.dumps({"version": 2, "entries": [
        {"dataset": old, "run_id": "old1", "guarantee": "dp", "status": "settled",
         "reserved_epsilon": 3.0, "reserved_delta": 1e-6, "epsilon": 3.0, "delta": 1e-6}],
        "budgets": {old: {"total_epsilon": 4.0}}}))
    led = BudgetLedger(path)
    (src,) = led.sources()
    assert src["epsilon"] == 3.0 and src["total_epsilon"] == 4.0 and src["names"] == []
    with pytest.raises(BudgetRefusedError, match="matched by records"):
        led.reserve(ident(led), "new1", 2.0, 1e-6)
    led.reserve(ident(led), "new1", 1.0, 1e-6)
    (src,) = led.sources()
    assert src["names"] == ["/data/a.csv"] and src["epsilon"] == pytest.approx(4.0)


# ------------------------------------------------------------------ seeds, sticky budgets, non-DP


def test_a_seed_is_never_reused_on_any_source(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    d = ident(led)
    led.reserve(d, "run1", 1.0, 0.0, noise_seed=7)
    led.reserve(d, "run1", 1.0, 0.0, noise_seed=7)  # resume: the same run is fine
    with pytest.raises(BudgetRefusedError, match="identical noise"):
        led.reserve(d, "run2", 1.0, 0.0, noise_seed=7)
    # D plus one record, at another path: the old code accepted it (finding 4)
    with pytest.raises(BudgetRefusedError, match="identical noise"):
        led.reserve(ident(led, TEXTS + ["x"], name="/other.csv"), "run3", 1.0, 0.0,
                    noise_seed=7)
    with pytest.raises(BudgetRefusedError, match="identical noise"):  # unrelated data too
        led.reserve(ident(led, ["a", "b"], name="/u.csv"), "run3", 1.0, 0.0, noise_seed=7)
    led.reserve(d, "run2", 1.0, 0.0, noise_seed=8)
    led.reserve(d, "run4", 1.0, 0.0)  # secure noise: no seed
    assert all("seed" not in e and "noise_seed" not in e for e in led.entries())  # tag only
    assert all(len(e["seed_tag"]) == 64 for e in led.entries() if "seed_tag" in e)


def test_a_source_budget_is_stored_and_sticks(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    d = ident(led)
    src = led.reserve(d, "run1", 4.0, 1e-6, total_epsilon=6.0).sources[0].source
    assert led.source(src)["total_epsilon"] == 6.0
    with pytest.raises(BudgetRefusedError, match="total is epsilon=6"):  # not repeated
        led.reserve(d, "run2", 4.0, 1e-6)
    with pytest.raises(BudgetRefusedError):  # a config cannot loosen it
        led.reserve(d, "run2", 4.0, 1e-6, total_epsilon=50.0)
    led.reserve(d, "run2", 1.0, 1e-6)
    (set_,) = led.set_budget(src, 10.0, None)  # only an explicit budget set changes it
    assert set_["total_epsilon"] == 10.0
    assert led.set_budget("/data/a.csv", 10.0, None)[0]["source"] == src  # by name too
    led.reserve(d, "run3", 4.0, 1e-6)
    assert led.spent(src) == pytest.approx((9.0, 3e-6))
    with pytest.raises(PrivacyConfigError, match="both"):
        led.set_budget(src, None, None)
    with pytest.raises(PrivacyConfigError, match="no data source 'nothing'"):
        led.set_budget("nothing", 1.0, None)
    # budget set on data no run has read yet creates its source, capped before any run
    new = ident(led, ["fresh one", "fresh two"], name="/new.csv")
    (created,) = led.set_budget(new, 1.0, None)
    with pytest.raises(BudgetRefusedError, match="total is epsilon=1"):
        led.reserve(new, "run5", 2.0, 1e-6)
    assert created["runs"] == []


def test_the_default_cap_holds_a_source_without_one_and_is_never_stored(
        tmp_path: Path) -> None:
    """``default_epsilon`` caps a source that has no cap (stored or configured) without
    becoming its cap: a run without it (``no_cap``) goes past, a stored or configured cap
    replaces it, and a resume re-reserving the same run is not counted twice."""
    led = BudgetLedger(tmp_path / "ledger.json")
    d = ident(led)
    src = led.reserve(d, "run1", 6.0, 1e-6, default_epsilon=DEFAULT_TOTAL_EPSILON)
    sid = src.sources[0].source
    led.reserve(d, "run1", 6.0, 1e-6, default_epsilon=DEFAULT_TOTAL_EPSILON)  # a resume
    with pytest.raises(BudgetRefusedError, match=r"total is epsilon=10 \(default\)"):
        led.reserve(d, "run2", 4.5, 1e-6, default_epsilon=DEFAULT_TOTAL_EPSILON)
    assert led.source(sid)["total_epsilon"] is None and led.run_entries("run2") == []
    led.reserve(d, "run2", 4.0, 1e-6, default_epsilon=DEFAULT_TOTAL_EPSILON)  # 10: at the cap
    led.reserve(d, "run3", 5.0, 1e-6)  # no_cap: past the default knowingly
    assert led.spent(sid)[0] == pytest.approx(15.0)
    with pytest.raises(BudgetRefusedError, match="total is epsilon=16,"):  # config replaces
        led.reserve(d, "run4", 2.0, 1e-6, total_epsilon=16.0,
                    default_epsilon=DEFAULT_TOTAL_EPSILON)
    led.set_budget(sid, 30.0, None)  # the operator's cap replaces the default upwards
    led.reserve(d, "run4", 10.0, 1e-6, default_epsilon=DEFAULT_TOTAL_EPSILON)
    assert DEFAULT_TOTAL_EPSILON == 10.0  # the documented figure (docs/methods.md, README)


def test_runs_without_a_classical_guarantee_are_recorded(tmp_path: Path) -> None:
    led = BudgetLedger(tmp_path / "ledger.json")
    d = ident(led)
    src = led.reserve(d, "dp1", 1.0, 1e-6).sources[0].source
    led.record_run(d, "inf1", "none", details={"method": "aug_pe"})
    led.record_run(d, "secpe1", "secret-protection", details={"p": 1e-4, "r": 1e-3})
    by_run = {e["run_id"]: e for e in led.entries(src)}
    assert by_run["inf1"]["guarantee"] == "none" and by_run["inf1"]["status"] == "recorded"
    assert by_run["secpe1"]["p"] == 1e-4
    assert led.spent(src) == pytest.approx((1.0, 1e-6))  # they add nothing to the sums
    with pytest.raises(PrivacyConfigError, match="guarantee"):
        led.record_run(d, "x", "dp")
    with pytest.raises(PrivacyConfigError, match="DP reservation"):
        led.record_run(d, "dp1", "none")


# ------------------------------------------------------------------ CLI: show, set, rekey


def _cli(*argv: str):
    from dpsynth.cli import app

    return CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{broken", "not valid JSON"),
        ('{"entries": 3}', "no 'entries' list"),
        ('{"entries": [{"dataset": "d"}]}', "entry 0"),
        ('{"entries": [], "budgets": [1]}', "budgets"),
        ('{"version": 3, "entries": [], "sources": {"s": {"names": 1}}}', "sources"),
    ],
)
def test_budget_show_corrupt_ledger_exit_2(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(content)
    for extra in ((), ("--json",)):
        res = _cli("budget", "show", "--ledger", str(path), *extra)
        assert res.exit_code == 2, res.output
        assert needle in res.output and "Traceback" not in res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)


def test_budget_show_directory_and_unreadable_exit_2(tmp_path: Path) -> None:
    res = _cli("budget", "show", "--ledger", str(tmp_path))
    assert res.exit_code == 2 and "is a directory" in res.output
    blocked = tmp_path / "file"
    blocked.write_text("x")
    res = _cli("budget", "show", "--ledger", str(blocked / "ledger.json"))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output


def test_budget_cli_show_set_rekey(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    data = tmp_path / "data.csv"
    data.write_text("text,label\nhello there,a\ngeneral kenobi,b\n")
    led = BudgetLedger(path)  # an epsilon = inf run while the source had no cap
    led.record_run(DataIdentity(str(data.resolve()), "x", "r", ()), "run-inf", "none")
    res = _cli("budget", "set", "--data", str(data), "--total-epsilon", "3",
               "--total-delta", "1e-5", "--ledger", str(path), "--json")
    assert res.exit_code == 0, res.output
    (src,) = json.loads(res.stdout)["sources"]
    assert src["names"] == [str(data.resolve())] and src["total_epsilon"] == 3.0
    assert "1 run(s) without an (epsilon, delta) guarantee" in " ".join(res.stderr.split())
    with pytest.raises(BudgetRefusedError, match="budget cap"):  # not once it has one
        led.record_run(DataIdentity(str(data.resolve()), "x", "r", ()), "run-inf2", "none")
    led.reserve(DataIdentity(str(data.resolve()), "other bytes", "r", ()), "run-a", 1.0, 1e-6)
    led.settle("run-a", 0.8, 1e-6)
    out = json.loads(_cli("budget", "show", "--ledger", str(path), "--json").stdout)
    (shown,) = out["sources"]
    assert shown["epsilon"] == pytest.approx(0.8) and shown["runs_without_dp_guarantee"] == 1
    assert len(shown["versions"]) == 3  # budget set's version and the two runs' contents
    res = _cli("budget", "show", "--ledger", str(path))
    assert res.exit_code == 0 and "run-a" in res.stdout and "of 3" in res.stdout
    assert "1 without DP" in res.stdout and "versions: 3" in res.stdout
    for argv, needle in [
        (["--total-epsilon", "1"], "exactly one"),
        (["--source", "x", "--data", str(data), "--total-epsilon", "1"], "exactly one"),
        (["--source", "x"], "--total-epsilon"),
        (["--source", "x", "--total-epsilon", "-1"], "--total-epsilon"),
        (["--source", "x", "--total-delta", "2"], "--total-delta"),
        (["--source", "nope", "--total-epsilon", "1"], "no data source 'nope'"),
        (["--data", str(tmp_path / "missing.csv"), "--total-epsilon", "1"], "missing.csv"),
    ]:
        res = _cli("budget", "set", *argv, "--ledger", str(path))
        assert res.exit_code == 2 and needle in res.output, (argv, res.output)
        assert "Traceback" not in res.output
    led.key_path.unlink()
    res = _cli("budget", "show", "--ledger", str(path))
    assert res.exit_code == 2 and "ledger key is missing" in res.output
    assert _cli("budget", "rekey", "--ledger", str(path)).exit_code == 2  # needs --yes
    res = _cli("budget", "rekey", "--ledger", str(path), "--yes")
    assert res.exit_code == 0 and "1 sources kept" in res.output, res.output
    assert json.loads(_cli("budget", "show", "--ledger", str(path), "--json").stdout)[
        "sources"][0]["epsilon"] == pytest.approx(0.8)
