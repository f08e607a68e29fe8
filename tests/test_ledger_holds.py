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

from dpsynth.identity import normalise_record, text_sketch
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
    key = b"k" * 32
    texts = ["First record.", "second RECORD ", "third"]
    edited = ["FIRST RECORD", "second record.", " Third !"]
    assert text_sketch(texts, key, normalised=True) == text_sketch(edited, key, normalised=True)
    assert text_sketch(texts, key) != text_sketch(edited, key)  # the exact sketch differs


EDITS = {
    "trailing-space": lambda t: t + " ",
    "full-stop": lambda t: t + ".",
    "upper-case": str.upper,
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
    from dpsynth.config import parse_config
    from dpsynth.privacy import BudgetRefusedError
    from dpsynth.rag.build import build_kb
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
