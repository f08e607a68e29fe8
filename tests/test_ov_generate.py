"""The OpenVINO sampling engine (dpsynth.llm.ov_generate) and its sampling (dpsynth.llm.sampling).

Fast tests check the sampling functions against a plain NumPy reference; the rest run the real
offline SmolLM2 on OpenVINO (bf16 where the CPU has it natively, else f32) through
``LocalGenerator``, the path a run takes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsynth.errors import ConfigError
from dpsynth.llm import (
    GenerationError,
    GenerationRequest,
    SamplingParams,
    load_generator,
    ov_generate,
)
from dpsynth.llm import local as local_mod
from dpsynth.llm.engine_check import compare_with_float
from dpsynth.llm.sampling import (
    FIRST_LOOK,
    TOPP_CANDIDATES,
    candidates,
    draw,
    next_tokens,
    nucleus,
)

models = pytest.mark.models
CHAT = ({"role": "user", "content": "Write a short message to your clinic."},)


# ------------------------------------------------------------------ sampling, no model
def test_nucleus_keeps_the_fewest_reaching_top_p() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert nucleus(p, 0.5) == 1
    assert nucleus(p, 0.7) == 2
    assert nucleus(p, 0.8 + 1e-9) == 3
    assert nucleus(p, 1.0) == 3
    assert nucleus(np.array([0.2, 0.1]), 0.95) == 2  # a cut that never reaches top_p: all


def test_draw_is_the_inverse_cdf() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert [draw(p, u) for u in (0.0, 0.49, 0.5, 0.79, 0.8, 0.999999)] == [0, 0, 1, 1, 2, 2]
    assert draw(p * 0.1, 0.6) == 1  # unnormalised: scaled by its own total


def reference(logits: np.ndarray, params: SamplingParams) -> list[tuple[list[int], np.ndarray]]:
    """Per row, the candidates by the module docstring's rules, computed the slow way."""
    out = []
    for row in logits.astype(np.float64) / params.temperature:
        order = np.argsort(-row, kind="stable")
        probs = np.exp(row - row.max())
        probs /= probs.sum()
        if not params.top_k and params.top_p >= 1:
            out.append((list(range(len(row))), probs))  # the whole vocabulary, in id order
            continue
        if params.top_k:
            order = order[: params.top_k]
            kept = probs[order] / probs[order].sum()
        else:
            kept = probs[order]
            if params.top_p < 1:
                order, kept = order[:TOPP_CANDIDATES], kept[:TOPP_CANDIDATES]
        if params.top_p < 1:
            n = int(np.argmax(np.cumsum(kept) >= params.top_p)) + 1 \
                if np.cumsum(kept)[-1] >= params.top_p else len(kept)
            order, kept = order[:n], kept[:n]
        out.append((order.tolist(), kept))
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=50),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
    SamplingParams(temperature=0.8, top_p=0.95),
    SamplingParams(temperature=1.0),
])
def test_candidates_match_the_slow_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    vocab = 5000
    peaked = rng.normal(size=vocab) + np.where(np.arange(vocab) < 10, 12.0, 0.0)
    flat = rng.normal(size=vocab) * 0.3  # its nucleus passes FIRST_LOOK: the wide path
    logits = np.stack([peaked, flat]).astype(np.float32)
    got = candidates(torch.from_numpy(logits), params)
    want = reference(logits, params)
    if params.top_p < 1 and not params.top_k:
        assert len(want[0][0]) <= FIRST_LOOK < len(want[1][0])  # both paths are exercised
    for (ids, probs), (ref_ids, ref_probs) in zip(got, want, strict=True):
        assert list(ids) == ref_ids
        np.testing.assert_allclose(probs / probs.sum(), ref_probs / ref_probs.sum(), rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_in_the_callers_buffer_draws_the_same(temperature: float) -> None:
    # the engine lets the sampling scale its reused logits buffer in place (no [B, V] copy a
    # step); the candidates and tokens must be those of the copying path, and without
    # ``scratch`` the caller's logits are never touched
    logits = torch.from_numpy(np.random.default_rng(2).normal(size=(4, 3000)).astype(np.float32))
    kept = logits.clone()
    p = SamplingParams(temperature=temperature, top_k=50)
    want = next_tokens(logits, p, [np.random.default_rng(s) for s in range(4)])
    assert torch.equal(logits, kept)
    got = next_tokens(logits, p, [np.random.default_rng(s) for s in range(4)], scratch=True)
    assert got.tolist() == want.tolist()
    for (ids, probs), (ref_ids, ref_probs) in zip(
            candidates(kept.clone(), p, scratch=True), candidates(kept, p), strict=True):
        assert ids.tolist() == ref_ids.tolist() and np.array_equal(probs, ref_probs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_the_reused_logit_buffers_hold_the_output_layers_numbers(dtype, bias: bool) -> None:
    rng = np.random.default_rng(4)
    weight = torch.from_numpy(rng.normal(size=(500, 64)).astype(np.float32)).to(dtype)
    b = torch.from_numpy(rng.normal(size=500).astype(np.float32)).to(dtype) if bias else None
    buffers = ov_generate.LogitBuffers(9, weight)
    for rows in (9, 5, 1):  # the batch shrinks as rows end: the first rows are reused
        h = torch.from_numpy(rng.normal(size=(rows, 64)).astype(np.float32)).to(dtype)
        got = buffers.product(h, weight, b)
        assert got.dtype == torch.float32 and got.shape == (rows, 500)
        assert torch.equal(got, torch.nn.functional.linear(h, weight, b).float())


def test_greedy_takes_the_first_largest() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 5.0]])
    got = next_tokens(logits, SamplingParams(temperature=0.0), [])
    assert got.tolist() == [1, 0]


def test_a_rows_token_follows_its_own_generator_only() -> None:
    logits = torch.from_numpy(np.random.default_rng(1).normal(size=(3, 300)).astype(np.float32))
    p = SamplingParams(temperature=1.0, top_p=0.9)
    first = next_tokens(logits, p, [np.random.default_rng(s) for s in (7, 8, 9)])
    swapped = next_tokens(logits[[2, 0, 1]], p, [np.random.default_rng(s) for s in (9, 7, 8)])
    assert swapped.tolist() == [first[2], first[0], first[1]]


def test_draws_follow_the_candidates_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -8.0]])
    p = SamplingParams(temperature=1.0, top_p=0.9)
    (ids, probs), = candidates(logits, p)
    assert list(ids) == [0, 1, 2]  # 0.64 + 0.24 = 0.88 < 0.9: a third token reaches it
    rng = np.random.default_rng(3)
    n = 20000
    counts = np.bincount([int(next_tokens(logits, p, [rng])[0]) for _ in range(n)],
                         minlength=5)
    want = probs / probs.sum()
    assert counts[3:].sum() == 0
    np.testing.assert_allclose(counts[:3] / n, want, atol=4 * np.sqrt(want / n).max())


# ------------------------------------------------------------------ the engine, real model
@pytest.fixture(scope="module")
def ov_smollm():
    """SmolLM2 on the OpenVINO engine (the default where the CPU has native bf16)."""
    return load_generator({"backend": "local", "model": "smollm2", "engine": "openvino"})


def reqs(seeds: list[int | None], tokens: int = 12) -> list[GenerationRequest]:
    return [GenerationRequest(CHAT, SamplingParams(temperature=1.0, max_new_tokens=tokens,
                                                   seed=s)) for s in seeds]


@models
def test_openvino_is_close_to_float32(ov_smollm) -> None:
    assert ov_smollm.engine == "openvino"
    pairs = [
        ("Dear doctor,", " I would like to move my appointment on Tuesday to Friday morning."),
        ("The patient wrote to the clinic because", " her knee still hurts after the operation."),
        ("The capital of France is", " Paris, and the capital of Germany is Berlin."),
    ]
    q = compare_with_float(ov_smollm, pairs)
    # Measured (bf16, AVX512-BF16): KL 0.0007, top-1 0.97; ctranslate2 int8: 0.066 and 0.74.
    assert q["positions"] >= 20
    assert q["mean_kl"] < 0.01 and q["top1_agreement"] >= 0.9, q


@models
@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_the_output_layer_does_not_follow_torchs_threads(precision: str, ov_smollm) -> None:
    # torch's threads follow the idle cores; a seeded run's texts must not (torch's float32
    # product of 7 rows differs between one thread and two here: 4.6e-5)
    engine = ov_smollm.sampling_engine if precision == "bf16" else \
        ov_generate.OpenVinoEngine(ov_smollm, "f32")
    hidden = np.random.default_rng(0).normal(size=(7, engine._weight.shape[1])).astype(np.float32)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(engine.logits(hidden))
            assert torch.get_num_threads() == threads  # restored after the block
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


@models
def test_the_engines_buffered_logits_are_its_plain_logits(ov_smollm) -> None:
    engine = ov_smollm.sampling_engine
    hidden = np.random.default_rng(5).normal(size=(6, engine._weight.shape[1])).astype(np.float32)
    buffers = ov_generate.LogitBuffers(6, engine._weight)
    assert torch.equal(engine.logits(hidden, into=buffers), engine.logits(hidden))
    assert torch.equal(engine.logits(hidden[:2], into=buffers), engine.logits(hidden[:2]))


@models
def test_seeds_fix_each_rows_text(ov_smollm) -> None:
    first = ov_smollm.generate(reqs([1, 2, 3]), progress=False)
    assert ov_smollm.generate(reqs([1, 2, 3]), progress=False) == first
    assert len(set(first)) == 3  # rows of one batch draw differently
    other = ov_smollm.generate(reqs([1, 5, 6]), progress=False)
    assert other[0] == first[0] and other[1:] != first[1:]  # a row follows its own seed
    free = reqs([None] * 3)
    assert ov_smollm.generate(free, progress=False) != ov_smollm.generate(free, progress=False)


@models
def test_rows_end_by_eos_or_length(ov_smollm) -> None:
    long = ov_smollm.complete(reqs([4], tokens=3), progress=False)[0]
    assert long.finish_reason == "length" and long.completion_tokens == 3
    greedy = SamplingParams(temperature=0.0, max_new_tokens=200)
    short = ov_smollm.complete([GenerationRequest(
        ({"role": "user", "content": "Answer with one word: yes or no?"},), greedy)],
        progress=False)[0]
    assert short.finish_reason == "stop" and 0 < short.completion_tokens < 200
    assert short.text and "<|im_end|>" not in short.text


@models
def test_batches_of_mixed_prompt_lengths_match_alone(ov_smollm) -> None:
    # f32: left padding and the shared prefix are masked exactly, so each row greedy-decodes
    # as it does alone (in bf16 a batch's rounding differs in the last bits, which flips exact
    # ties: the third prompt's 5th token is one, "woman" / "wizard" at equal bf16 log-probs)
    engine = ov_generate.OpenVinoEngine(ov_smollm, "f32")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    texts = ["The capital of France is", ov_smollm.render(GenerationRequest(CHAT, greedy))[0],
             "Once upon a time, in a small village by the sea, there"]
    rows = [ov_smollm.encode_prompt(t) for t in texts]
    run = lambda batch: engine.generate(batch, greedy, [None] * len(batch),  # noqa: E731
                                        [()] * len(batch), ov_smollm.decode)
    together = run(rows)
    assert together == [run([r])[0] for r in rows]
    assert all(len(ids) == 8 and not ended for ids, ended in together)
    chats = [rows[1], ov_smollm.encode_prompt(ov_smollm.render(GenerationRequest(
        ({"role": "user", "content": "Say hello to the nurse."},), greedy))[0])]
    assert run(chats) == [run([r])[0] for r in chats]  # rows continuing a shared prefix


def test_distinct_rows_and_the_row_each_continues() -> None:
    unique, index = ov_generate.distinct_rows([[1, 2], [3], [1, 2], [1, 2], [3, 4]])
    assert unique == [[1, 2], [3], [3, 4]] and index.tolist() == [0, 1, 0, 0, 2]


@models
def test_repeated_prompts_are_prefilled_once_and_decode_as_alone(ov_smollm, monkeypatch) -> None:
    # a zero-shot batch repeats its label prompts: each distinct prompt is prefilled once and
    # its rows continue that state row (f32, so each row greedy-decodes exactly as alone); a
    # row continuing the wrong state row would write another prompt's text
    engine = ov_generate.OpenVinoEngine(ov_smollm, "f32")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    rows = [ov_smollm.encode_prompt(t) for t in
            ["The capital of France is", "Once upon a time, in a small village, there",
             "My favourite food is"]]
    prefilled: list[int] = []
    prefill = ov_generate.ov_stepper.prefill

    def counting(*args):
        prefilled.append(len(args[-1]))
        return prefill(*args)

    monkeypatch.setattr(ov_generate.ov_stepper, "prefill", counting)
    run = lambda batch: engine.generate(batch, greedy, [None] * len(batch),  # noqa: E731
                                        [()] * len(batch), ov_smollm.decode)
    alone = [run([r])[0] for r in rows]
    prefilled.clear()
    batch = [rows[0], rows[1], rows[0], rows[2], rows[1], rows[0]]
    assert run(batch) == [alone[i] for i in (0, 1, 0, 2, 1, 0)]
    assert prefilled == [3]
    assert len({tuple(ids) for ids, _ in alone}) == 3


@models
def test_sampling_never_loads_the_float_model_once_exported(ov_smollm) -> None:
    fresh = local_mod.LocalGenerator("smollm2", engine="openvino",
                                     cache_dir=ov_smollm.model_dir.parent)
    greedy = [GenerationRequest(CHAT, SamplingParams(temperature=0.0, max_new_tokens=6))]
    assert fresh.generate(greedy, progress=False) == ov_smollm.generate(greedy, progress=False)
    assert fresh._model is None  # the output layer came from the safetensors file
    stored = fresh.sampling_engine._weight
    loaded = ov_smollm.model.get_output_embeddings().weight.detach().to(stored.dtype)
    assert torch.equal(stored, loaded)


@models
def test_auto_falls_back_when_openvino_cannot_open(ov_smollm, monkeypatch) -> None:
    monkeypatch.setattr(local_mod, "openvino_fits", lambda gen: True)

    def broken(*args, **kwargs):
        raise PermissionError("read-only model directory")

    monkeypatch.setattr(ov_generate.ov_stepper, "compiled", broken)
    gen = local_mod.LocalGenerator("smollm2", cache_dir=ov_smollm.model_dir.parent)
    assert gen.engine in ("ctranslate2", "transformers") and gen._ov is None
    with pytest.raises(GenerationError, match="OpenVINO engine cannot open .PermissionError"):
        local_mod.LocalGenerator("smollm2", engine="openvino",
                                 cache_dir=ov_smollm.model_dir.parent)


@models
def test_openvino_refuses_a_model_it_cannot_export() -> None:
    with pytest.raises(ConfigError, match="engine 'openvino' cannot run it .*sliding-window"):
        local_mod.LocalGenerator("gemma3", engine="openvino")
