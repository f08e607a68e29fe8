"""Duplicate rows: counted for the operator (terminal, private/diagnostics.jsonl), never in a
shared file; `data.deduplicate: true` drops them, the budget stays the file's."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.data import load_dataset
from dpsynth.diagnostics import read_diagnostics
from test_release_check import pe_config, private_rows, write_csv

DUPLICATES = 7


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    rows = private_rows(30)
    return write_csv(tmp_path / "d.csv", rows + rows[:DUPLICATES])


def _run(tmp_path: Path, data: Path, name: str, **over: object) -> Path:
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config
    from fakes import FakeEmbedder, FakeGenerator

    cfg = parse_config(pe_config("aug_pe", data, **over))
    return run_generation(cfg, tmp_path / name, generators=[FakeGenerator("fake-g0")],
                          embedder=FakeEmbedder())


def _shared_text(run: Path) -> str:
    files = [run / "log.txt", run / "stats.jsonl", *sorted((run / "release").rglob("*.json*"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in files)


def test_duplicates_are_said_to_the_operator_only(tmp_path: Path, data: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    run = _run(tmp_path, data, "kept")
    err = capsys.readouterr().err
    assert f"warning: {DUPLICATES} rows of d.csv repeat an earlier row" in " ".join(err.split())
    assert "data.deduplicate: true" in err
    found = [d for d in read_diagnostics(run) if d.get("kind") == "duplicates"]
    assert found and found[0]["rows"] == DUPLICATES and found[0]["dropped"] is False
    assert stat.S_IMODE((run / "private" / "diagnostics.jsonl").stat().st_mode) == 0o600
    shared = _shared_text(run)  # log.txt, stats.jsonl, release/: no word of it
    assert "repeat an earlier" not in shared and "diagnostics" not in shared


def test_deduplicate_drops_them_and_keeps_the_files_budget(tmp_path: Path, data: Path) -> None:
    kept = _run(tmp_path, data, "kept")
    dropped = _run(tmp_path, data, "dropped", **{"data.deduplicate": True,
                                                 "privacy.seed": None})
    records = {r: [d for d in read_diagnostics(r) if d.get("kind") == "dataset"][0]["records"]
               for r in (kept, dropped)}
    assert records[kept] == 30 + DUPLICATES and records[dropped] == 30
    found = [d for d in read_diagnostics(dropped) if d.get("kind") == "duplicates"]
    assert found[0]["dropped"] is True
    sources = [json.loads((r / "run.json").read_text())["sources"] for r in (kept, dropped)]
    assert sources[0] == sources[1]  # one source for the ledger: dropping rows opens no budget


def test_user_level_duplicates_are_matched_within_a_user(tmp_path: Path) -> None:
    rows = [{"text": "same words", "label": "billing", "user": u} for u in ("a", "a", "b")]
    path = write_csv(tmp_path / "u.csv", rows)
    across = load_dataset(path, "text", ["label"], "user", on_duplicate="drop")
    within = load_dataset(path, "text", ["label"], "user", on_duplicate="drop",
                          duplicates_within_user=True)
    assert len(across) == 1 and across.duplicates == 2
    assert len(within) == 2 and within.duplicates == 1
    assert sorted(within.users) == ["a", "b"]  # b keeps its record: only a's own copy went
    whole = load_dataset(path, "text", ["label"], "user")
    assert within.content_digest() == across.content_digest() == whole.content_digest()


def test_generate_cli_summary_counts_them_and_release_is_shareable(tmp_path: Path,
                                                                  data: Path) -> None:
    from dpsynth.cli.generate import print_summary

    run = _run(tmp_path, data, "kept")
    summary = json.loads((run / "release" / "summary.json").read_text())
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    from rich.console import Console

    console = Console(record=True, width=120)
    import dpsynth.cli.generate as gen_cli

    orig = gen_cli.Console
    gen_cli.Console = lambda *a, **k: console  # type: ignore[assignment,misc]
    try:
        print_summary(run, summary, privacy)
    finally:
        gen_cli.Console = orig  # type: ignore[misc]
    text = " ".join(console.export_text().split())
    assert f"duplicate rows │ {DUPLICATES} kept as records" in text
    assert "(4, 1e-05)-DP per record" in text  # epsilon to 3 significant digits
    for f in (run / "release").rglob("*"):
        want = 0o755 if f.is_dir() else 0o644
        assert stat.S_IMODE(f.stat().st_mode) == want, f
    assert stat.S_IMODE((run / "release").stat().st_mode) == 0o755
    for f in (run / "private").rglob("*"):
        if f.is_file():
            assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f
    assert stat.S_IMODE((run / "private").stat().st_mode) == 0o700


def test_data_check_and_generate_agree_on_the_count(tmp_path: Path, data: Path) -> None:
    res = CliRunner().invoke(app, ["data", "check", str(data), "--text", "text", "--label",
                                   "label", "--json"])
    assert json.loads(res.stdout)["summary"]["duplicates"] == DUPLICATES
