"""The OpenVINO stepper's pure parts and its selection (synrag.stepper), without a model; its
numbers against torch float32 are in test_rag_models.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.config import ConfigError
from dpsynth.llm.ov_stepper import (
    MASKED,
    prefill_mask,
    runnable_precision,
    unsupported_config,
)
from dpsynth.methods.synrag.config import check_stepper, choose_stepper


def test_prefill_mask_sees_prefix_own_tokens_causally_and_no_pad() -> None:
    valid = np.array([[False, True, True], [True, True, True]])
    m = prefill_mask(2, valid)
    assert m.shape == (2, 1, 3, 5) and m.dtype == np.float32
    seen = m[:, 0] == 0.0
    assert seen[:, :, :2].all()  # every query sees the two shared keys
    # row 0: the pad (key 2) is never seen by a real query; the pad query sees only itself
    assert seen[0, 0].tolist() == [True, True, True, False, False]
    assert seen[0, 1].tolist() == [True, True, False, True, False]
    assert seen[0, 2].tolist() == [True, True, False, True, True]
    assert seen[1, 2].all() and not seen[1, 0, 3:].any()
    assert set(np.unique(m)) <= {0.0, MASKED}


def test_bf16_needs_two_threads() -> None:
    """OpenVINO dies compiling bf16 for one thread (the compile itself is tested with SmolLM2
    in test_rag_models.py): one thread runs f32."""
    assert runnable_precision("bf16", 1) == "f32"
    assert runnable_precision("bf16", 2) == "bf16"
    assert runnable_precision("f32", 1) == "f32"
    with pytest.raises(ValueError, match="precision"):
        runnable_precision("int4", 2)


def test_unsupported_config_names_sliding_windows_and_softcaps() -> None:
    assert unsupported_config({"model_type": "llama", "sliding_window": None}) is None
    assert "sliding" in unsupported_config(
        {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
                                                 "sliding_window": 512}})
    assert "sliding" in unsupported_config(
        {"model_type": "x", "layer_types": ["full_attention", "sliding_attention"]})
    assert "soft-caps" in unsupported_config({"model_type": "g2",
                                              "attn_logit_softcapping": 50.0})


def test_check_stepper_fails_before_any_budget_for_a_model_it_cannot_run(tmp_path) -> None:
    check_stepper("auto", "gemma3")  # auto falls back: nothing to refuse
    check_stepper("transformers", "gemma3")
    with pytest.raises(ConfigError, match="synrag.stepper.*gemma3.*sliding"):
        check_stepper("openvino", "gemma3")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "m", "sliding_window": 8}))
    with pytest.raises(ConfigError, match="sliding"):
        check_stepper("openvino", str(tmp_path))
    check_stepper("openvino", "smollm2")


class _Gen:
    """A generator whose OpenVINO export fails (or succeeds) as told."""

    device = "cpu"

    def __init__(self, export_fails: bool) -> None:
        self.export_fails = export_fails
        self.stepper_engine = "transformers"

    @property
    def model(self) -> Any:
        class _Config:
            def to_dict(self) -> dict[str, Any]:
                return {"model_type": "llama"}

        class _Model:
            config = _Config()

        return _Model()

    def set_stepper_engine(self, engine: str) -> None:
        if engine == "openvino" and self.export_fails:
            raise RuntimeError("export failed")
        self.stepper_engine = engine


def test_choose_stepper_auto_falls_back_and_explicit_openvino_raises() -> None:
    assert choose_stepper(_Gen(export_fails=False), "auto") == "openvino"
    gen = _Gen(export_fails=True)
    assert choose_stepper(gen, "auto") == "transformers"
    assert gen.stepper_engine == "transformers"
    with pytest.raises(RuntimeError):
        choose_stepper(_Gen(export_fails=True), "openvino")
    assert choose_stepper(_Gen(export_fails=False), "transformers") == "transformers"


def test_export_is_cached_and_redone_when_the_weights_change(tmp_path, monkeypatch) -> None:
    import dpsynth.llm.ov_stepper as ovs

    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"v1")
    exports: list[str] = []

    def fake_export(gen: Any, path: Any) -> None:  # the trace itself is tested with SmolLM2
        exports.append(str(path))
        path.write_text((model_dir / "model.safetensors").read_text())

    monkeypatch.setattr(ovs, "_export", fake_export)
    gen = _Gen(export_fails=False)
    gen.model_dir = model_dir  # type: ignore[attr-defined]
    gen.name = "local:m"  # type: ignore[attr-defined]
    graph = ovs.ensure_exported(gen)
    assert graph == tmp_path / "m-openvino" / ovs.GRAPH and graph.read_text() == "v1"
    assert ovs.ensure_exported(gen) == graph and len(exports) == 1  # cached
    (model_dir / "model.safetensors").write_bytes(b"v2-new")  # other weights: stale export
    assert ovs.ensure_exported(gen).read_text() == "v2-new" and len(exports) == 2
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob(".m-openvino.tmp-*"))


def test_rag_build_refuses_openvino_for_gemma3_before_anything_is_written(tmp_path,
                                                                           monkeypatch) -> None:
    from pathlib import Path

    from typer.testing import CliRunner

    from dpsynth.cli import app

    ledger = tmp_path / "ledger" / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(ledger))
    example = Path(__file__).resolve().parents[1] / "examples" / "tiny-synrag.yaml"
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["rag", "build", str(example), "--output", str(out),
                                      "--set", "synrag.stepper=openvino",
                                      "--set", "generators=[{model: gemma3}]"])
    assert result.exit_code == 2, result.output
    assert "synrag.stepper: 'openvino' cannot run gemma3" in result.output
    assert "Traceback" not in result.output
    assert not out.exists() and not ledger.exists()  # no budget reserved, nothing written


def test_auto_dtype_is_bf16_only_with_native_bf16_instructions() -> None:
    """AVX512 without AVX512-BF16 emulates bf16 (the OpenVINO bf16 stepper ran 14x slower than
    float32 there), so 'auto' must not pick it; oneDNN's own check says yes on such a CPU."""
    from dpsynth.llm.local import bf16_supported, native_bf16
    from dpsynth.methods.synrag.config import resolve_logits_dtype

    assert not native_bf16({"avx2", "avx512f", "avx512bw", "avx512_vnni"})
    assert native_bf16({"avx512f", "avx512_bf16"}) and native_bf16({"amx_tile", "amx_bf16"})
    try:
        text = Path("/proc/cpuinfo").read_text("utf-8")
    except OSError:
        pytest.skip("no /proc/cpuinfo to compare with")
    flags = {w for line in text.splitlines() if line.startswith("flags")
             for w in line.split(":", 1)[1].split()}
    assert bf16_supported() == native_bf16(flags)  # torch's checks agree with the kernel's
    assert resolve_logits_dtype("auto") == ("bfloat16" if native_bf16(flags) else "float32")
    assert resolve_logits_dtype("bfloat16") == "bfloat16"
