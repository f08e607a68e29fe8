"""The local generation engine: selection, ctranslate2 conversion cache, seeds, quality, threads.

Fast tests use tiny fake directories; the rest use the real offline SmolLM2 (``smollm``,
conftest, default engine: openvino where the CPU has native bf16, else ctranslate2;
``ct2_smollm`` on ctranslate2) and, for the quality guard, Gemma 3 270M. The OpenVINO engine's
own tests are in tests/test_ov_generate.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dpsynth.config import GeneratorConfig
from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams, load_generator, runtime
from dpsynth.llm import ct2 as ct2_mod
from dpsynth.llm import local as local_mod
from dpsynth.llm.engine_check import compare_with_float

needs_ct2 = pytest.mark.skipif(not ct2_mod.available(), reason="ctranslate2 not installed")
CHAT = ({"role": "user", "content": "Write a short message to your clinic."},)


# ------------------------------------------------------------------ fast, no model
def test_engine_resolution(monkeypatch) -> None:
    assert runtime.resolve_engine("transformers") == "transformers"
    assert runtime.resolve_engine("ctranslate2") == "ctranslate2"
    monkeypatch.setattr(ct2_mod, "available", lambda: False)
    assert runtime.resolve_engine("auto") == "transformers"
    monkeypatch.setattr(ct2_mod, "available", lambda: True)
    assert runtime.resolve_engine("auto") == "ctranslate2"
    with pytest.raises(ValueError, match="engine must be one of"):
        runtime.resolve_engine("vllm")


def test_config_engine_and_threads_reach_the_spec() -> None:
    assert GeneratorConfig().spec() == "smollm2"
    assert GeneratorConfig().batch_size is None  # picked by the engine
    spec = GeneratorConfig(engine="transformers", threads=1).spec()
    assert spec == {"backend": "local", "model": "smollm2", "engine": "transformers",
                    "num_threads": 1}
    # what loads the model carries the batch size; what a release records of it does not
    assert GeneratorConfig(batch_size=4).spec() == "smollm2"
    assert GeneratorConfig(batch_size=4).load_spec() == {"backend": "local", "model": "smollm2",
                                                         "batch_size": 4}
    assert GeneratorConfig(threads=1, batch_size=2).load_spec() == {**spec, "batch_size": 2,
                                                                    "engine": "auto"}
    with pytest.raises(ValueError):
        GeneratorConfig(engine="onnx")
    with pytest.raises(ValueError, match="unknown local keys"):
        load_generator({"backend": "local", "model": "smollm2", "threads": 2})


def test_threads_never_exceed_idle_cores(monkeypatch) -> None:
    monkeypatch.delenv("DPSYNTH_TORCH_THREADS", raising=False)
    monkeypatch.setattr(runtime, "available_cores", lambda: 4)
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert runtime.default_threads() == 1  # busy machine: one thread, no oversubscription
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert runtime.default_threads() == 4
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    assert runtime.default_threads() == 3
    assert runtime.idle_threads() == 3


def test_conversion_fingerprint_tracks_the_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"x" * 10)
    out = ct2_mod.converted_dir(src, tmp_path / "cache", "src", embedded=False)
    assert out.parent == tmp_path / "cache" / "_ct2" and out.name.endswith("-int8")
    assert not ct2_mod.is_current(out, src)
    out.mkdir(parents=True)
    (out / "model.bin").write_bytes(b"")
    meta = {"source": ct2_mod.source_fingerprint(src), "quantization": "int8"}
    (out / ct2_mod.CT2_MARKER).write_text(json.dumps(meta))
    assert ct2_mod.is_current(out, src)
    (src / "model.safetensors").write_bytes(b"y" * 11)  # the source changed: stale
    assert not ct2_mod.is_current(out, src)
    assert ct2_mod.seed32(2**40 + 5) == 5 and 0 <= ct2_mod.seed32(None) < 2**32


def test_shared_prefix_leaves_a_token_per_row() -> None:
    assert ct2_mod.shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5, 6]]) == 3
    assert ct2_mod.shared_prefix([[1, 2], [1, 2, 3]]) == 1  # the shorter row keeps one token
    assert ct2_mod.shared_prefix([[7, 8, 9]]) == 2
    assert ct2_mod.shared_prefix([[1], [2]]) == 0


def test_ct2_batches_are_sorted_by_prompt_length() -> None:
    from dpsynth.llm.batching import plan_batches

    p = SamplingParams(temperature=1.0)
    reqs = [GenerationRequest(f"r{i}", p) for i in range(5)]
    assert plan_batches(reqs, 2) == [[0, 1], [2, 3], [4]]
    assert plan_batches(reqs, 2, lengths=[9, 1, 5, 1, 3]) == [[1, 3], [4, 2], [0]]
    # a repeated prompt's requests sit together (OpenVINO prefills it once a batch)
    same = [GenerationRequest(t, p) for t in ("a", "b", "a", "c", "b", "a")]
    assert plan_batches(same, 3, lengths=[1] * 6) == [[0, 2, 5], [1, 4, 3]]


# ------------------------------------------------------------------ real SmolLM2
models = pytest.mark.models


@needs_ct2
@models
def test_default_engine_and_ct2_conversion_is_cached(smollm, ct2_smollm, monkeypatch) -> None:
    want = "openvino" if local_mod.openvino_fits(smollm) else "ctranslate2"
    assert smollm.engine == want and smollm.batch_size == runtime.AUTO_BATCH[want]
    assert ct2_mod.is_current(ct2_smollm.ct2_dir, ct2_smollm.model_dir)

    def no_convert(*args, **kwargs):
        raise AssertionError("a current conversion must not be converted again")

    monkeypatch.setattr(ct2_mod, "convert", no_convert)
    monkeypatch.setattr(local_mod, "openvino_fits", lambda gen: False)
    again = local_mod.LocalGenerator("smollm2", cache_dir=smollm.model_dir.parent)
    assert again.engine == "ctranslate2" and again.ct2_converted is False
    assert again._model is None  # sampling alone never loads the float32 model


@needs_ct2
@models
def test_auto_falls_back_to_transformers_when_conversion_fails(smollm, monkeypatch) -> None:
    def broken(model_dir, out_dir):
        raise RuntimeError("unsupported architecture")

    monkeypatch.setattr(ct2_mod, "is_current", lambda *a: False)
    monkeypatch.setattr(ct2_mod, "convert", broken)
    monkeypatch.setattr(local_mod, "openvino_fits", lambda gen: False)
    gen = local_mod.LocalGenerator("smollm2", cache_dir=smollm.model_dir.parent, batch_size=2)
    assert gen.engine == "transformers" and gen._model is not None
    with pytest.raises(GenerationError, match="conversion to ctranslate2 failed"):
        local_mod.LocalGenerator("smollm2", cache_dir=smollm.model_dir.parent,
                                 engine="ctranslate2")


@needs_ct2
@models
def test_per_request_seeds_are_deterministic(ct2_smollm, monkeypatch) -> None:
    smollm = ct2_smollm
    def reqs(seeds: list[int]) -> list[GenerationRequest]:
        return [
            GenerationRequest(CHAT, SamplingParams(temperature=1.0, max_new_tokens=12, seed=s))
            for s in seeds
        ]

    engine = smollm._ct2
    made: list[Any] = []
    real_module = engine._ct2
    real = real_module.Generator

    class Counting:  # ctranslate2 as the engine sees it, counting the generators it makes
        def __getattr__(self, name: str) -> Any:
            return getattr(real_module, name)

        @staticmethod
        def Generator(*args: Any, **kwargs: Any) -> Any:  # noqa: N802
            made.append(args)
            return real(*args, **kwargs)

    monkeypatch.setattr(engine, "_ct2", Counting())
    first = smollm.generate(reqs([1, 2, 3]), progress=False)
    assert len(made) == 1  # a sampled batch runs on a freshly seeded engine
    assert smollm.generate(reqs([1, 2, 3]), progress=False) == first
    assert len(set(first)) == 3  # rows of one batch draw differently
    assert smollm.generate(reqs([4, 5, 6]), progress=False) != first
    # The thread count does not change the texts (the next batch may get other threads).
    one = local_mod.LocalGenerator("smollm2", cache_dir=smollm.model_dir.parent, num_threads=1,
                                   engine="ctranslate2")
    assert one.generate(reqs([1, 2, 3]), progress=False) == first
    # Unseeded requests draw fresh OS randomness, not the last batch's seed.
    free = [GenerationRequest(CHAT, SamplingParams(temperature=1.0, max_new_tokens=12))] * 3
    assert smollm.generate(free, progress=False) != smollm.generate(free, progress=False)


@needs_ct2
@models
@pytest.mark.parametrize("which", ["smollm", "ct2_smollm"])
def test_chat_template_reaches_the_engine(which: str, request, monkeypatch) -> None:
    smollm = request.getfixturevalue(which)
    seen: list[list[int]] = []
    engine = smollm.sampling_engine
    real = engine.generate

    def spy(prompts, *args, **kwargs):
        seen.extend(list(p) for p in prompts)
        return real(prompts, *args, **kwargs)

    monkeypatch.setattr(engine, "generate", spy)
    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    out = smollm.generate([GenerationRequest(CHAT, p), GenerationRequest("Hello", p)],
                          progress=False)
    texts = sorted((smollm.tokenizer.decode(r) for r in seen), key=len)  # batch: by length
    assert texts[0] == "Hello"
    rendered = texts[1]
    assert rendered.startswith("<|im_start|>") and rendered.rstrip().endswith("assistant")
    assert "Write a short message" in rendered and "<|im_start|>" not in out[0]


@needs_ct2
@models
@pytest.mark.parametrize("which", ["smollm", "ct2_smollm"])
def test_stop_strings_end_rows_early(which: str, request) -> None:
    smollm = request.getfixturevalue(which)
    p = SamplingParams(temperature=0.0, max_new_tokens=24, stop=("\n",))
    before = smollm.generated_tokens
    (cut,) = smollm.generate([GenerationRequest("The capital of France is", p)], progress=False)
    assert "\n" not in cut
    assert smollm.generated_tokens - before < 24  # the engine stopped at the newline


@needs_ct2
@models
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_int8_quality_guard(model: str, ct2_smollm) -> None:
    gen = ct2_smollm if model == "smollm2" else load_generator(
        {"backend": "local", "model": "gemma3", "engine": "ctranslate2"})
    assert gen.engine == "ctranslate2"
    pairs = [
        ("Dear doctor,", " I would like to move my appointment on Tuesday to Friday morning."),
        ("The patient wrote to the clinic because", " her knee still hurts after the operation."),
        ("The capital of France is", " Paris, and the capital of Germany is Berlin."),
    ]
    q = compare_with_float(gen, pairs)
    # Measured: SmolLM2 KL ~0.08, top-1 ~0.82; Gemma 3 KL ~0.03, top-1 ~0.87.
    assert q["positions"] >= 20
    assert q["mean_kl"] < 0.2 and q["top1_agreement"] >= 0.7, q


def test_topp_runs_within_candidates_and_the_rest_is_exact() -> None:
    assert ct2_mod._topk(SamplingParams(temperature=1.0)) == 0  # the whole vocabulary
    assert ct2_mod._topk(SamplingParams(temperature=0.8, top_k=40)) == 40
    assert ct2_mod._topk(SamplingParams(temperature=0.8, top_p=0.9)) == ct2_mod.TOPP_CANDIDATES


@needs_ct2
@models
def test_bench_generation_cli_json(smollm, small_probe) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli.bench import bench_app

    res = CliRunner().invoke(bench_app, ["generation", "--prompts", "2", "--tokens", "4",
                                         "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("engine", "tokens_per_second", "baseline_tokens_per_second", "speedup"):
        assert key in data
    assert data["engine"] == smollm.engine and data["tokens"]["engine"] > 0
    assert data["speedup"] == pytest.approx(
        data["tokens_per_second"] / data["baseline_tokens_per_second"], rel=0.01)
