"""The ledger holds against copies and edits, and the cap is checked on every path (issue 43,
findings 2-4 and the smaller run.json / --resume --set items). Each test drives the CLI as a
user would, on the fast fakes behind the real runner (tests/test_budget_bypass.py's fixture);
each finding's mutant (copy-resume allowed, exact-byte sketch, cap skipped for epsilon = inf
or SecPE) makes one of these fail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpsynth.identity import DataIdentity, normalise_record, text_sketch
from dpsynth.privacy.ledger import BudgetLedger, OtherFolderError, check_folder
from dpsynth.run_folder import RunDir
from test_budget_bypass import _crashed_run, _rows, cli, env, generate, refused, sources  # noqa: F401


def _capped(env: dict[str, Any], total: float = 2.0) -> None:  # noqa: F811
    res = cli("budget", "set", "--data", env["data"], "--total-epsilon", str(total))
    assert res.exit_code == 0, res.output


def _config_for(env: dict[str, Any], path: Path, name: str, **changes: Any) -> Path:  # noqa: F811
    raw = yaml.safe_load(env["cfg"].read_text())
    raw["data"]["path"] = str(path)
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    out = env["tmp"] / name
    out.write_text(yaml.safe_dump(raw))
    return out


# ------------------------------------------------------------- a source is its records
def test_normalised_records_ignore_case_spacing_and_end_punctuation() -> None:
    assert normalise_record("  Hello,   WORLD!  ") == "hello, world"
    assert normalise_record("ＦＵＬＬ width.") == "full width"  # NFKC
    assert normalise_record("Straße") == normalise_record("STRASSE")  # case-folded
    assert normalise_record("a  b\tc") == "a b c"
    assert normalise_record("keep, inner. punctuation") == "keep, inner. punctuation"
    assert normalise_record("zero\u200bwidth soft\u00adhyphen\ufeff") == "zerowidth softhyphen"
    key = b"k" * 32
    texts = ["First record.", "second RECORD ", "third"]
    edited = ["FIRST RECORD", "second record.", " Third !"]
    assert text_sketch(texts, key, normalised=True) == text_sketch(edited, key, normalised=True)
    assert text_sketch(texts, key) != text_sketch(edited, key)  # the exact sketch differs


EDITS = {
    "trailing-space": lambda t: t + " ",
    "full-stop": lambda t: t + ".",
    "upper-case": str.upper,
    "zero-width": lambda t: t.replace(" ", " \u200b"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_trivially_edited_copy_is_the_same_source(env: dict[str, Any], edit: str) -> None:  # noqa: F811
    """Finding 3: the review spent 8 on a source capped at 2 through such copies."""
    _capped(env)
    assert generate(env, "r1").exit_code == 0  # 2 of 2 spent
    lines = _rows().splitlines()[1:]
    copy = env["tmp"] / f"copy-{edit}.jsonl"
    rows = [json.dumps({"text": EDITS[edit](line.split(",")[0]),
                        "intent": line.split(",")[1]}) for line in reversed(lines)]
    copy.write_text("\n".join(rows) + "\n")  # another format, rows reversed, texts edited
    msg = refused(generate(env, "r2", config=_config_for(env, copy, f"{edit}.yaml")))
    assert "matched by overlap" in msg and "total is epsilon=2" in msg
    assert len(sources(env)) == 1


def test_other_records_are_another_source(env: dict[str, Any]) -> None:  # noqa: F811
    """The normalised sketch does not merge unrelated data: a file whose records have other
    words is a new source with a budget of its own."""
    _capped(env)
    assert generate(env, "r1").exit_code == 0
    other = env["tmp"] / "other.csv"
    other.write_text("text,intent\n" + "".join(
        f"an unrelated note {i * 13} on weather {i},{['card_arrival', 'refund', 'top_up'][i % 3]}\n"
        for i in range(60)))
    res = generate(env, "r2", config=_config_for(env, other, "other.yaml"))
    assert res.exit_code == 0, res.output
    assert len(sources(env)) == 2


# ------------------------------------------------------------- the cap on every path
def test_epsilon_inf_is_research_mode_only(env: dict[str, Any]) -> None:  # noqa: F811
    msg = refused(generate(env, "r1", "privacy.epsilon=inf"))
    assert "research mode" in msg and "privacy.noise: seeded" in msg
    assert not (env["tmp"] / "r1").exists()
    assert generate(env, "r2", "privacy.epsilon=inf", "privacy.noise=seeded").exit_code == 0


def test_epsilon_inf_is_refused_on_a_capped_source(env: dict[str, Any]) -> None:  # noqa: F811
    """Finding 4: an epsilon = inf run went through on a source spent to its cap and released
    exact vote counts."""
    _capped(env)
    msg = refused(generate(env, "r1", "privacy.epsilon=inf", "privacy.noise=seeded"))
    assert "budget cap" in msg and "no (epsilon, delta) guarantee" in msg
    assert not (env["tmp"] / "r1").exists()
    (src,) = sources(env)
    assert src["runs"] == []
    # a cap given in the run's own config counts too
    res = generate(env, "r2", "privacy.epsilon=inf", "privacy.noise=seeded",
                   "privacy.total_epsilon=100", "data.source=fresh-name")
    assert "budget cap" in refused(res)


def test_secpe_is_refused_on_a_capped_source(env: dict[str, Any]) -> None:  # noqa: F811
    _capped(env, 10.0)
    cfg = _config_for(env, env["data"], "secpe.yaml", method="secpe",
                      secpe={"secrets": [{"kind": "strings", "values": ["order 7"]}],
                             "clusters": 2})
    msg = refused(generate(env, "r1", config=cfg))
    assert "budget cap" in msg and "secret protection" in msg
    assert not (env["tmp"] / "r1").exists()


# ------------------------------------------------------------- one reservation, one release
def test_a_copied_or_moved_run_folder_cannot_resume(env: dict[str, Any]) -> None:  # noqa: F811
    """Finding 2: cp -r of an interrupted run, then --resume on both, released twice on one
    charge. The copy (and a moved folder) is refused; the original resumes."""
    run = _crashed_run(env, "r1")
    copy = env["tmp"] / "r1-copy"
    shutil.copytree(run, copy)
    msg = refused(generate(env, "r1-copy", resume=True))
    assert "reserved by the run folder" in msg and str(run.resolve()) in msg
    assert not (copy / "release" / "synthetic.jsonl").exists()
    moved = env["tmp"] / "r1-moved"
    shutil.move(str(copy), moved)
    assert "reserved by the run folder" in refused(generate(env, "r1-moved", resume=True))
    res = generate(env, "r1", resume=True)  # the original still resumes
    assert res.exit_code == 0, res.output
    (src,) = sources(env)
    assert [e["status"] for e in src["runs"]] == ["settled"]
    # the original deleted and a copy put in its place: another folder all the same
    restored = env["tmp"] / "backup"
    shutil.copytree(run, restored)
    shutil.rmtree(run)
    shutil.move(str(restored), run)
    meta = json.loads((run / "run.json").read_text())
    meta["status"] = "failed"  # as the backup was taken before the run finished
    (run / "run.json").write_text(json.dumps(meta))
    assert "reserved by the run folder" in refused(generate(env, "r1", resume=True))


def test_a_killed_run_reads_interrupted_and_resumes(env: dict[str, Any], tmp_path: Path  # noqa: F811
                                                    ) -> None:
    """kill -9 of a real process mid-run: run.json said "running" for ever; now any reader
    gets "interrupted", and --resume of the original folder continues it."""
    out = env["tmp"] / "killed"
    script = tmp_path / "slow_run.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from fakes import FakeEmbedder, FakeGenerator
        import dpsynth.api

        class Slow(FakeGenerator):
            def generate(self, requests, **kw):
                time.sleep(600)

        dpsynth.api.run_generation({str(env["cfg"])!r}, {str(out)!r}, progress=False,
                                   generators=[Slow("fake-g0")], embedder=FakeEmbedder())
    """))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        for _ in range(600):
            if (out / "run.json").exists() and sources(env) and sources(env)[0]["runs"]:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the run never reserved its budget")
        assert RunDir(out).meta()["status"] == "running"  # alive: not misread
    finally:
        proc.kill()
        proc.wait()
    meta = RunDir(out).meta()
    assert meta["status"] == "interrupted" and "killed" in meta["reason"]
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    res = generate(env, "killed", resume=True)
    assert res.exit_code == 0, res.output
    assert RunDir(out).meta()["status"] == "finished"


def test_set_on_a_finished_run_says_it_changes_nothing(env: dict[str, Any]) -> None:  # noqa: F811
    assert generate(env, "r1").exit_code == 0
    msg = refused(generate(env, "r1", "generators.0.timeout_s=30", resume=True))
    assert "already finished" in msg and "changes nothing" in msg
    assert generate(env, "r1", resume=True).exit_code == 0  # a plain resume: nothing to do


def test_the_rag_build_is_charged_and_refused_at_the_cap(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-SynRAG's build reserves on the same ledger and meets the same cap (fakes)."""
    from dpsynth.api import build_kb
    from dpsynth.config import parse_config
    from dpsynth.privacy import BudgetRefusedError
    from fakes import FakeEmbedder, FakeGenerator
    from test_release_check import private_rows, rag_config, write_csv

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    data = write_csv(tmp_path / "docs.csv", private_rows(40))
    cfg = rag_config(data)
    cfg["privacy"].update(epsilon=3.0, total_epsilon=5.0, noise="secure")
    for key in ("ledger", "seed"):
        cfg["privacy"].pop(key, None)

    def build(out: str) -> Path:
        return Path(build_kb(parse_config(cfg), tmp_path / out,
                             generator=FakeGenerator("fake-g0"), embedder=FakeEmbedder()))

    build("kb1")
    res = cli("budget", "show", "--json")
    (src,) = json.loads(res.stdout)["sources"]
    assert src["epsilon"] == pytest.approx(3.0, abs=1e-6) and src["total_epsilon"] == 5.0
    with pytest.raises(BudgetRefusedError, match="total is epsilon=5"):
        build("kb2")
    assert not (tmp_path / "kb2").exists()


def test_a_parquet_copy_is_the_same_source(env: dict[str, Any]) -> None:  # noqa: F811
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    _capped(env)
    assert generate(env, "r1").exit_code == 0
    table = pd.read_csv(env["data"])
    copy = env["tmp"] / "copy.parquet"
    table.iloc[::-1].assign(text=table["text"].iloc[::-1] + " .").to_parquet(copy)
    msg = refused(generate(env, "r2", config=_config_for(env, copy, "parquet.yaml")))
    assert "matched by overlap" in msg and "total is epsilon=2" in msg


# ------------------------------------------------------------- one reservation, one release
def test_a_backup_restored_in_place_cannot_resume(env: dict[str, Any]) -> None:  # noqa: F811
    """The folder's contents restored from a backup into the same folder: the same path and
    the same directory (device, inode), so these alone take it for the original (as does
    `rm -r RUN && cp -r BACKUP RUN` where ext4 hands out the freed inode numbers again). The
    anchor file's inode and inode change time, which no copy carries, tell them apart."""
    run = _crashed_run(env, "r1")
    backup = env["tmp"] / "backup"
    shutil.copytree(run, backup)  # taken while the run was interrupted
    before = RunDir(run).folder_identity()
    assert generate(env, "r1", resume=True).exit_code == 0  # the original releases once
    for child in run.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    shutil.copytree(backup, run, dirs_exist_ok=True)
    after = RunDir(run).folder_identity()
    assert {k: after[k] for k in ("path", "device", "inode")} == {
        k: before[k] for k in ("path", "device", "inode")}
    assert after["anchor"]["nonce"] == before["anchor"]["nonce"]  # the bytes are carried
    assert after["anchor"] != before["anchor"]
    msg = refused(generate(env, "r1", resume=True))
    assert "reserved by the run folder" in msg and "start a new run" in msg
    assert "--resume (run folder" not in msg  # not told to resume what cannot be resumed
    assert not (run / "release" / "synthetic.jsonl").exists()
    (src,) = sources(env)
    assert [e["status"] for e in src["runs"]] == ["settled"]
    assert src["epsilon"] == pytest.approx(2.0, abs=1e-3)


def test_a_settled_run_never_releases_again(env: dict[str, Any]) -> None:  # noqa: F811
    """The original folder itself, its entry settled but run.json not saying finished (a stop
    between the ledger's settle and the status, or an old run.json put back): refused."""
    assert generate(env, "r1").exit_code == 0
    meta_path = env["tmp"] / "r1" / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["status"] = "failed"
    meta_path.write_text(json.dumps(meta))
    msg = refused(generate(env, "r1", resume=True))
    assert "already settled" in msg and "cannot be resumed" in msg


def test_a_copy_of_a_run_that_never_reserved_cannot_reserve_it_too(env: dict[str, Any]) -> None:  # noqa: F811
    """A run killed before its reservation, copied: whichever folder resumes first reserves
    the run, bound to itself; the other is refused (and two processes racing are refused
    under the ledger's lock: the reservation itself checks the folder)."""
    from dpsynth.runner import open_run

    run, _, _ = open_run(env["cfg"], env["tmp"] / "r1", resume=False)
    copy = env["tmp"] / "r1-copy"
    shutil.copytree(run.root, copy)
    assert generate(env, "r1-copy", resume=True).exit_code == 0
    msg = refused(generate(env, "r1", resume=True))
    assert "reserved by the run folder" in msg and str(copy.resolve()) in msg
    (src,) = sources(env)
    assert len(src["runs"]) == 1 and src["epsilon"] == pytest.approx(2.0, abs=1e-3)


def test_the_ledger_binds_a_reservation_to_one_folder(tmp_path: Path) -> None:
    """The ledger's own check, as two processes racing to reserve one run would meet it."""
    book = BudgetLedger(tmp_path / "ledger.json")
    data = DataIdentity(name="src", content="c" * 64, records="r" * 64, sketch=())
    here, there = (RunDir(tmp_path / n) for n in ("here", "there"))
    for run in (here, there):
        run.create("method: aug_pe\n", "aug_pe")
    book.reserve(data, "run-1", 1.0, 1e-6, folder=here.folder_identity())
    book.reserve(data, "run-1", 1.0, 1e-6, folder=here.folder_identity())  # its own resume
    for folder in (there.folder_identity(), None):
        with pytest.raises(OtherFolderError, match="reserved by the run folder"):
            book.reserve(data, "run-1", 1.0, 1e-6, folder=folder)
    book.record_run(data, "run-2", "none", folder=here.folder_identity())
    with pytest.raises(OtherFolderError):
        book.record_run(data, "run-2", "none", folder=there.folder_identity())
    assert len(book.run_entries("run-1")) == 1
    assert book.run_entries("run-1")[0]["folder"] == here.folder_identity()


def test_a_method_with_an_unknown_guarantee_is_never_run_uncharged(env: dict[str, Any]) -> None:  # noqa: F811
    """Fail closed: a plan whose guarantee the ledger does not know is refused, not run."""
    from dpsynth.errors import ConfigError
    from dpsynth.methods.aug_pe import AugPE
    from dpsynth.runner import RunOptions, run_method
    from fakes import FakeEmbedder, FakeGenerator

    class Unknown(AugPE):
        def plan(self, config: Any, dataset: Any, run: Any) -> Any:
            plan = super().plan(config, dataset, run)
            plan.guarantee = "approximate"
            return plan

    with pytest.raises(ConfigError, match="cannot charge"):
        run_method(env["cfg"], env["tmp"] / "odd", method=Unknown(), options=RunOptions(
            progress=False, generators=[FakeGenerator("fake-g0")], embedder=FakeEmbedder()))
    assert not (env["tmp"] / "odd" / "release" / "synthetic.jsonl").exists()
    assert all(src["runs"] == [] for src in sources(env))


def test_a_federated_run_reserves_through_the_same_path(env: dict[str, Any]) -> None:  # noqa: F811
    """Federated WASP is charged by the runner before any party or Ray cluster is reached: on
    a spent source it is refused (the Ray address here answers nobody)."""
    _capped(env)
    assert generate(env, "r1").exit_code == 0
    cfg = _config_for(env, env["data"], "fed.yaml", method="wasp",
                      wasp={"federated": {"parties": 3, "ray_address": "127.0.0.1:9"}})
    msg = refused(generate(env, "r2", config=cfg))
    assert "privacy budget of data source" in msg and "total is epsilon=2" in msg
    assert not (env["tmp"] / "r2").exists()


def test_the_report_reads_a_killed_run_as_interrupted(tmp_path: Path) -> None:
    """eval's load_run reads run.json itself: a run whose process is gone reads interrupted."""
    from dpsynth.eval.common import EvalInputError
    from dpsynth.eval.release import load_run

    run = RunDir(tmp_path / "run")
    run.create("method: aug_pe\n", "aug_pe")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    child.kill()
    child.wait()
    meta = json.loads(run.meta_path.read_text())
    meta["process"] = {**meta["process"], "pid": child.pid, "start": None}
    run.meta_path.write_text(json.dumps(meta))
    with pytest.raises(EvalInputError, match="status interrupted"):
        load_run(run.root)


def test_older_ledgers_and_run_folders_keep_working(tmp_path: Path) -> None:
    """A ledger from before the normalised sketch matches by its exact sketch (each kind only
    against its own); an entry bound before the anchor file compares what it recorded."""
    import random

    book = BudgetLedger(tmp_path / "ledger.json")
    exact = tuple(sorted(random.Random(1).sample(range(1, 2**63), 40)))
    book.reserve(DataIdentity("old", "a" * 64, "b" * 64, exact), "old-run", 1.0, 1e-6)
    stored = json.loads(book.path.read_text())
    (version,) = stored["sources"][next(iter(stored["sources"]))]["versions"]
    assert version["normalised_sketch"] == []  # as an older ledger holds it: no such sketch
    copy = DataIdentity("elsewhere", "c" * 64, "d" * 64, exact)
    assert [m.how for m in book.resolve(copy).sources] == [["overlap"]]
    crossed = DataIdentity("elsewhere", "c" * 64, "d" * 64, (), normalised=exact)
    assert [m.how for m in book.resolve(crossed).sources] == [[]]  # a new source

    run = RunDir(tmp_path / "run")
    run.create("method: aug_pe\n", "aug_pe")
    now = run.folder_identity()
    old_entry = {"folder": {k: now[k] for k in ("path", "device", "inode")}}
    check_folder([old_entry], "r", now)  # the original folder resumes
    other = RunDir(tmp_path / "other")
    other.create("method: aug_pe\n", "aug_pe")
    with pytest.raises(OtherFolderError):
        check_folder([old_entry], "r", other.folder_identity())


def test_every_run_says_what_its_source_has_spent(env: dict[str, Any]) -> None:  # noqa: F811
    """No silent spend: the run's log (and display) names the source's spend against its cap
    (or the default cap) when it reserves and when it settles, warns past half the cap, and
    says how to set a cap where there is none."""
    assert generate(env, "r1").exit_code == 0
    log = " ".join((env["tmp"] / "r1" / "log.txt").read_text().split())
    assert "has spent epsilon 2 of the default cap 10 with this run (8 left)" in log
    assert "has no cap of its own; `dpsynth budget set" in log
    assert "of the default cap 10 after this run" in log
    res = cli("generate", env["cfg"], "-o", env["tmp"] / "r1b", "--quiet", "--no-cap")
    assert res.exit_code == 0, res.output
    log = " ".join((env["tmp"] / "r1b" / "log.txt").read_text().split())
    assert "has spent epsilon 4 with this run, and has no cap (--no-cap" in log
    _capped(env, 7.0)
    assert generate(env, "r2").exit_code == 0
    log = " ".join((env["tmp"] / "r2" / "log.txt").read_text().split())
    assert "has spent epsilon 6 of its cap 7 with this run (1 left)" in log
    assert "is past half of its cap with this run" in log
    assert "of its cap 7 after this run" in log


def test_a_source_without_a_cap_is_held_to_the_default(env: dict[str, Any]) -> None:  # noqa: F811
    """The issue's four probes at epsilon 4 on one file: the third is refused by the default
    cap (10), before anything is read; --no-cap runs past it knowingly; a cap the operator
    sets replaces the default (up or down), and a config's own total is never loosened by it.
    """
    for out in ("p1", "p2"):
        assert generate(env, out, "privacy.epsilon=4").exit_code == 0
    msg = refused(generate(env, "p3", "privacy.epsilon=4"))
    assert "epsilon=8" in msg and "epsilon=10 (default)" in msg and "--no-cap" in msg
    assert not (env["tmp"] / "p3").exists()  # refused before the folder holds anything
    (src,) = sources(env)
    assert src["epsilon"] == pytest.approx(8.0, abs=1e-3) and src["total_epsilon"] is None
    assert generate(env, "p4", "privacy.epsilon=4", "privacy.no_cap=true").exit_code == 0
    res = cli("budget", "show")
    assert "no cap of its own: 10 by default" in " ".join(res.output.split())
    _capped(env, 20.0)  # the operator's cap replaces the default
    assert generate(env, "p5", "privacy.epsilon=4").exit_code == 0
    # a run's own total still binds with --no-cap (spent 16, total 18 < 16 + 4)
    assert "refused" in refused(generate(env, "p6", "privacy.epsilon=4",
                                         "privacy.total_epsilon=18", "privacy.no_cap=true"))
