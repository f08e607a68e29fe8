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
from typing import Any

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


# -- bars count items, not batches (issue 46) ---------------------------------------------------
def test_a_plain_bar_prints_each_quarter_mark_once_when_a_batch_jumps_over_several() -> None:
    console, buf = _plain_console()
    with progress.session(console=console), progress.bar("generating (texts)", 100) as advance:
        advance(10)   # below the first mark: no line
        advance(70)   # crosses 25, 50 and 75 at once
        advance()     # the zero-argument call still counts one
        advance(19)
    lines = buf.getvalue().splitlines()
    marks = [ln.split("generating (texts): ", 1)[1] for ln in lines]
    assert marks[0] == "0/100"
    assert [m.split(",")[0] for m in marks[1:4]] == ["25/100", "50/100", "75/100"]
    assert "left" in marks[3] and "left" not in marks[1]  # the time left on the last one
    assert marks[4].startswith("100/100 in ") and len(marks) == 5


def test_a_live_bar_counts_what_advance_adds() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with progress.session(console=console), progress.bar("embedding (texts)", 40) as advance:
        advance(16)
        advance(16)
        advance(8)
    assert "embedding (texts): 40/40 in" in buf.getvalue()


def test_time_left_is_known_after_the_first_batch_and_counts_down() -> None:
    assert progress.time_left(0.0, 0, 100) is None  # nothing done: no estimate
    assert progress.time_left(10.0, 25, 100) == pytest.approx(30.0)  # 10 s for a quarter
    assert progress.time_left(10.0, 25, 100, since=12.0) == pytest.approx(18.0)
    assert progress.time_left(10.0, 25, 100, since=99.0) == 0.0


def _bare_local_generator(batch: int) -> Any:
    """The real LocalGenerator.complete over a stand-in engine: every text comes back as
    "ok" (no model loaded)."""
    from dpsynth.llm import Completion
    from dpsynth.llm.local import LocalGenerator

    gen = LocalGenerator.__new__(LocalGenerator)
    gen.name, gen.max_context, gen.batch_size, gen._ct2 = "local:stand-in", 512, batch, None
    gen._ov = None
    gen.render = lambda r: (str(r.prompt), (), False)
    gen.encode_prompt = lambda text: [1, 2, 3]
    gen._generate_batch = lambda prompts, *rest: [Completion("ok", "stop") for _ in prompts]
    return gen


def test_local_generation_counts_texts_not_batches() -> None:
    from dpsynth.llm import GenerationRequest

    gen = _bare_local_generator(batch=3)
    console, buf = _plain_console()
    with progress.session(console=console):
        texts = gen.generate([GenerationRequest(f"prompt {i}") for i in range(7)])
    assert texts == ["ok"] * 7 and gen.last_batch_sizes == [3, 3, 1]
    out = buf.getvalue()
    assert "local:stand-in generating (texts): 0/7" in out
    assert "local:stand-in generating (texts): 7/7 in" in out  # 7 texts, not 3 batches
    assert "/3" not in out


def test_embedding_counts_texts_not_passes() -> None:
    import numpy as np

    from dpsynth.embed.engines import FixedShapeEngine

    class StandIn(FixedShapeEngine):
        batch_size, dim, max_len, _pad_id, _filler = 4, 3, 32, 0, [1]

        def _tok(self, texts: list[str], **_: Any) -> dict[str, list[list[int]]]:
            return {"input_ids": [[1] * (2 + len(t) % 5) for t in texts]}

        def _pass(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return np.ones((len(ids), self.dim), dtype=np.float32)

    console, buf = _plain_console()
    with progress.session(console=console):
        out = StandIn().encode([f"text {'x' * i}" for i in range(10)], progress=True)
    assert out.shape == (10, 3)
    assert "embedding (texts): 0/10" in buf.getvalue()
    assert "embedding (texts): 10/10 in" in buf.getvalue()


def test_the_evaluation_embeds_under_a_bar_of_texts_named_by_set() -> None:
    from dpsynth.eval import suite

    console, buf = _plain_console()
    texts = [f"a short text number {i}" for i in range(suite.EMBED_CHUNK + 5)]
    with progress.session(console=console):
        emb = suite._embed(FakeEmbedder(), texts, "synthetic")
    assert emb.shape[0] == len(texts)
    assert f"embedding synthetic (texts): {len(texts)}/{len(texts)} in" in buf.getvalue()
    assert "a short text" not in buf.getvalue()  # names and counts, never a text


def test_private_prediction_advances_one_step_a_token_and_tops_up_an_early_end() -> None:
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.private_prediction import predict_text, private_predict
    from fakes import EOS_ID
    from test_synrag_support import OPTS, ScriptedSession

    gen = FakeGenerator()
    script = [gen.encode("the")[0], gen.encode("fever")[0], EOS_ID, 0, 0, 0]
    steps: list[int] = []
    pred = private_predict(ScriptedSession(script), "c", gen, ["a document"],
                           advance=lambda n=1: steps.append(n), **OPTS)
    assert pred.steps == 3 and steps == [1, 1, 1]  # ended at the third token
    steps.clear()
    scfg = SynRAGConfig(tokens=6, support="full")
    predict_text(ScriptedSession(script), "c", gen, ["a document"], scfg, 0.5,
                 advance=lambda n=1: steps.append(n))
    assert sum(steps) == 6 and steps[-1] == 3  # the bar reaches T: 3 tokens + the 3 skipped


def test_the_openvino_export_says_what_it_waits_for(monkeypatch, tmp_path) -> None:
    """The first run's OpenVINO export (the default generation engine where the CPU has native
    bf16) is a named step too; the export itself is stubbed (its real run is the models
    tests')."""
    from types import SimpleNamespace

    from dpsynth.llm import ov_stepper

    monkeypatch.setattr(ov_stepper, "_fingerprint", lambda gen: {"v": 1})
    monkeypatch.setattr(ov_stepper, "unsupported", lambda gen: None)
    monkeypatch.setattr(ov_stepper, "publish_dir", lambda out, build, current: None)
    gen = SimpleNamespace(model_dir=tmp_path / "SmolLM2-135M", name="local:SmolLM2-135M")
    console, buf = _plain_console()
    with progress.session(console=console):
        ov_stepper.ensure_exported(gen)
    assert "exporting SmolLM2-135M to OpenVINO (first use only): done in" in buf.getvalue()


def test_the_one_time_model_conversions_say_what_they_wait_for(monkeypatch, tmp_path) -> None:
    """The minutes a first run spends converting a model show as a named step, not a blank
    `0/?` (issue 46): the int8 conversion and the GGUF de-quantisation each say what they do
    and that it happens once. The conversions themselves are stubbed (their real runs are the
    models tests'); the display code is the one a run uses."""
    pytest.importorskip("ctranslate2")
    import torch
    import transformers

    from dpsynth.llm import ct2, models

    monkeypatch.setattr(ct2, "publish_dir", lambda out, build, current: None)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        staticmethod(lambda *a, **k: None))
    stop = RuntimeError("stubbed: the display line is what this test reads")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        staticmethod(lambda *a, **k: (_ for _ in ()).throw(stop)))
    console, buf = _plain_console()
    with progress.session(console=console):
        ct2.convert(tmp_path / "SmolLM2-135M", tmp_path / "out")
    assert "converting SmolLM2-135M to CTranslate2 int8 (first use only): done in" in \
        buf.getvalue()
    live = io.StringIO()  # on a terminal the step's spinner names it while it runs
    with progress.session(console=Console(file=live, force_terminal=True, width=120)), \
            pytest.raises(RuntimeError, match="stubbed"):
        models.convert_gguf(tmp_path / "smollm2.gguf", tmp_path / "f32")
    assert "de-quantising smollm2.gguf (first load only)" in live.getvalue()
    assert torch is not None
