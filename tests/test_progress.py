"""One progress display: the run's stages and iterations on the terminal, plain lines without
carriage returns when the output is not a terminal, third-party warnings routed off the
terminal, dpsynth's own warnings shown."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from dpsynth import progress
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv


def _plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, force_jupyter=False, width=80), buf


def test_quarter_marks() -> None:
    assert progress.quarter_marks(40) == [10, 20, 30]
    assert progress.quarter_marks(1) == []
    assert progress.quarter_marks(2) == [1]


def test_plain_output_is_lines_without_carriage_returns() -> None:
    console, buf = _plain_console()
    with progress.session(console=console) as display:
        assert not display.live
        progress.stage("iteration 2/3")
        with progress.bar("local:smollm2 generating", 8) as advance:
            for _ in range(8):
                advance()
        with progress.step("private vote and noise"):
            pass
        progress.note("iteration 2/3: 24 in pool")
    out = buf.getvalue()
    assert "\r" not in out and "\x1b" not in out
    lines = out.splitlines()
    assert any(ln.endswith("iteration 2/3 · local:smollm2 generating: 0/8") for ln in lines)
    assert any("iteration 2/3 · local:smollm2 generating: 4/8" in ln for ln in lines)
    assert any("iteration 2/3 · local:smollm2 generating: 8/8 in" in ln for ln in lines)
    assert any("iteration 2/3 · private vote and noise: done in" in ln for ln in lines)
    assert lines[-1].endswith("iteration 2/3: 24 in pool")


def test_terminal_output_draws_live_bars_and_keeps_a_done_line() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=100)
    with progress.session(console=console) as display:
        assert display.live
        progress.stage("initial pool")
        with progress.bar("embedding", 3) as advance:
            for _ in range(3):
                advance()
    assert "initial pool · embedding: 3/3 in" in buf.getvalue()


def test_a_disabled_display_shows_only_warnings() -> None:
    console, buf = _plain_console()
    with progress.session(enabled=False, console=console):
        progress.note("iteration 1/2")
        with progress.bar("generating", 4) as advance:
            advance()
        progress.warn("the endpoint http://a/v1 does not answer")
    assert buf.getvalue().strip() == "warning: the endpoint http://a/v1 does not answer"


def test_library_warnings_are_routed_and_own_warnings_shown(caplog: pytest.LogCaptureFixture
                                                            ) -> None:
    console, buf = _plain_console()
    with caplog.at_level(logging.DEBUG, logger=progress.THIRD_PARTY_LOGGER), \
            progress.session(console=console):
        warnings.warn_explicit("`torch_dtype` is deprecated", FutureWarning,
                               "/site-packages/transformers/modeling_utils.py", 10)
        logging.getLogger("dpsynth.llm.local").warning("ctranslate2 cannot convert; using "
                                                       "transformers")
    out = buf.getvalue()
    assert "deprecated" not in out  # a library's warning does not reach the terminal
    assert any("deprecated" in r.getMessage() for r in caplog.records)
    assert "warning: ctranslate2 cannot convert; using transformers" in out


def test_a_run_shows_its_stages_and_iterations_in_the_terminal(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    cfg = parse_config(pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20))))
    run_generation(cfg, tmp_path / "run", generators=[FakeGenerator("fake-g0")],
                   embedder=FakeEmbedder())
    err = capsys.readouterr().err
    assert "\r" not in err
    for want in ("initial pool: ", "iteration 1/2 · private vote and noise: done in",
                 "iteration 2/2: ", "release: 9 synthetic samples", "finished"):
        assert want in err, want
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "iteration 2/2" in log


def test_importing_openvino_writes_nothing_into_home(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    code = ("from dpsynth.embed import import_openvino; import_openvino(); "
            "import openvino; print(openvino.__name__)")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                   timeout=120)
    assert not (tmp_path / "intel").exists()
