"""The local backend over the real SmolLM2-135M-Instruct (GGUF, de-quantised).

``smollm`` (conftest) is the default engine (ctranslate2 when installed); ``tf_smollm`` is the
float32 transformers engine. Engine-specific checks: tests/test_llm_engine.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams
from dpsynth.llm import local as local_mod
from dpsynth.llm.cache import CachedGenerator, RequestCache

pytestmark = pytest.mark.models

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)
CHAT = ({"role": "user", "content": "Name one fruit."},)


@pytest.fixture(scope="module")
def tf_smollm(smollm) -> local_mod.LocalGenerator:
    """SmolLM2 on the transformers engine (same cached float32 weights as ``smollm``)."""
    return local_mod.LocalGenerator("smollm2", engine="transformers", batch_size=8)


def test_generate_plain_and_chat_reproducible_with_seed(smollm) -> None:
    p = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=12, seed=7)
    reqs = [GenerationRequest("My favourite food is", p), GenerationRequest(CHAT, p)]
    first = smollm.generate(reqs, progress=False)
    again = smollm.generate(reqs, progress=False)
    assert len(first) == 2 and all(isinstance(t, str) and t.strip() for t in first)
    assert first == again
    assert smollm.supports_chat and smollm.name == "local:smollm2"
    # The prompt is stripped: the chat answer does not echo the template.
    assert "<|im_start|>" not in first[1] and "Name one fruit" not in first[1]


def test_the_writer_replaces_the_chat_template_default_system_prompt(smollm) -> None:
    """SmolLM2's template puts "You are a helpful AI assistant" first when no system message
    is given: prompts.writer takes its place (dpsynth.evolution.prompts.render)."""
    from dpsynth.evolution.prompts import render

    default, _, _ = smollm.render(GenerationRequest(render("Write a question.", True)))
    writer, _, _ = smollm.render(GenerationRequest(render("Write a question.", True,
                                                          "a customer of a bank")))
    assert "helpful AI assistant" in default
    assert "helpful AI assistant" not in writer
    assert writer.index("You are a customer of a bank.") < writer.index("Write a question.")


def test_batched_equals_one_at_a_time_in_order(tf_smollm) -> None:
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
    reqs = [GenerationRequest(p, GREEDY) for p in prompts] + [GenerationRequest(CHAT, GREEDY)]
    batched = tf_smollm.generate(reqs, progress=False)
    assert tf_smollm.engine == "transformers" and tf_smollm.last_batch_sizes == [4]
    single = [tf_smollm.generate([r], progress=False)[0] for r in reqs]
    assert batched == single
    assert len(set(batched)) == 4
    reordered = tf_smollm.generate(reqs[::-1], progress=False)
    assert reordered == batched[::-1]


def test_default_engine_keeps_order_of_a_batch(smollm) -> None:
    # ctranslate2 prefills a batch up to its shortest prompt, so a greedy row may differ
    # between batch compositions (int8 near-ties); the order of results must still follow
    # the requests, and the same set gives the same texts.
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]
    reqs = [GenerationRequest(p, GREEDY) for p in prompts] + [GenerationRequest(CHAT, GREEDY)]
    batched = smollm.generate(reqs, progress=False)
    assert smollm.last_batch_sizes == [4] and len(set(batched)) == 4
    assert batched[0].startswith(" Paris")
    assert smollm.generate(reqs[::-1], progress=False) == batched[::-1]


def test_mixed_params_keep_batches_full(smollm) -> None:
    a = SamplingParams(temperature=0.0, max_new_tokens=3)
    b = SamplingParams(temperature=0.8, max_new_tokens=3)
    reqs = [
        GenerationRequest(
            f"Item {i}:", SamplingParams(**{**(a if i % 2 else b).to_dict(), "seed": i})
        )
        for i in range(6)
    ]
    out = smollm.generate(reqs, progress=False)
    assert len(out) == 6
    assert smollm.last_batch_sizes == [3, 3]


def test_stop_strings_cut_output(smollm) -> None:
    full = smollm.generate([GenerationRequest("The capital of France is", GREEDY)], progress=False)[
        0
    ]
    stop = SamplingParams(temperature=0.0, max_new_tokens=8, stop=("\n",))
    cut = smollm.generate([GenerationRequest("The capital of France is", stop)], progress=False)[0]
    assert "\n" in full, "premise: greedy output has a newline"
    assert cut == full.split("\n")[0] and "\n" not in cut


def test_context_overflow_is_a_clear_error(smollm) -> None:
    p = SamplingParams(max_new_tokens=smollm.max_context)
    with pytest.raises(GenerationError, match="request 0 needs") as err:
        smollm.generate([GenerationRequest("secret words here", p)], progress=False)
    assert "secret" not in str(err.value)


def test_next_token_logits_left_padding(smollm) -> None:
    prompts = ["Hello", "The capital of France is"]
    logits = smollm.next_token_logits(prompts)
    assert logits.shape == (2, smollm.vocab_size) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    alone = smollm.next_token_logits(prompts[:1])
    np.testing.assert_allclose(logits[0], alone[0], atol=2e-3, rtol=0)
    paris = smollm.encode(" Paris")[0]
    assert int(np.argmax(logits[1])) == paris


@pytest.mark.parametrize("prefix", ["", "Answer briefly.\n"])
def test_stepper_matches_full_recompute(smollm, prefix: str) -> None:
    prompts = ["The capital of France is", "My dog likes to"]
    if prefix:
        rows = [smollm.encode_prompt(prefix) + smollm.encode(p) for p in prompts]
    else:
        rows = [smollm.encode_prompt(p) for p in prompts]
    with smollm.open_stepper(prompts, shared_prefix=prefix) as st:
        np.testing.assert_allclose(st.logits(), smollm.next_token_logits_ids(rows), atol=2e-3)
        tokens: list[int] = []
        for _ in range(3):
            tok = int(np.argmax(st.logits()[0]))
            st.advance(tok)
            tokens.append(tok)
        expect = smollm.next_token_logits_ids([r + tokens for r in rows])
        got = st.logits()
        assert got.shape == expect.shape
        np.testing.assert_allclose(got, expect, atol=2e-3, rtol=0)
        assert st.tokens == tokens
    with pytest.raises(GenerationError, match="closed"):
        st.logits()


def test_dequantised_weights_cache_is_read_on_second_load(smollm, monkeypatch) -> None:
    assert smollm.load_source in ("gguf", "cache")
    cached = smollm.model_dir
    for f in (local_mod.MARKER, "config.json", "model.safetensors", "tokenizer.json"):
        assert (cached / f).is_file(), f

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF path must not be used when the cache exists")

    monkeypatch.setattr(local_mod, "convert_gguf", no_gguf)
    monkeypatch.setattr(local_mod, "embedded_gguf_path", no_gguf)
    again = local_mod.LocalGenerator("smollm2", cache_dir=cached.parent)
    assert again.load_source == "cache"
    np.testing.assert_allclose(
        again.next_token_logits(["Hi there"]), smollm.next_token_logits(["Hi there"]), atol=1e-5
    )


def test_cache_keeps_results_of_a_crash_mid_batch(smollm, tmp_path, monkeypatch) -> None:
    cache = RequestCache(tmp_path / "private" / "llm.sqlite")
    assert (cache.path.stat().st_mode & 0o777) == 0o600
    gen = CachedGenerator(smollm, cache)
    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    reqs = [GenerationRequest(f"Fact number {i}:", p) for i in range(4)]
    real_batch = smollm._generate_batch
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise GenerationError("injected crash")
        return real_batch(*args, **kwargs)

    monkeypatch.setattr(smollm, "batch_size", 2)
    monkeypatch.setattr(smollm, "_generate_batch", flaky)
    with pytest.raises(GenerationError, match="injected"):
        gen.generate(reqs, progress=False)
    assert len(cache) == 2  # the first batch was stored before the crash

    monkeypatch.setattr(smollm, "_generate_batch", real_batch)
    gen2 = CachedGenerator(smollm, cache)
    out = gen2.generate(reqs, progress=False)
    assert (gen2.hits, gen2.misses, gen2.calls) == (2, 2, 1)
    assert out == smollm.generate(reqs, progress=False)
    gen3 = CachedGenerator(smollm, RequestCache(cache.path))
    assert gen3.generate(reqs, progress=False) == out
    assert (gen3.hits, gen3.misses, gen3.calls) == (4, 0, 0)


def test_cli_generate_json(smollm) -> None:
    import json

    from typer.testing import CliRunner

    from dpsynth.cli.llm import group

    res = CliRunner().invoke(
        group,
        ["generate", "The capital of France is", "--plain", "--max-new-tokens", "4", "--json"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["model"] == "local:smollm2"
    assert data["outputs"] == [
        smollm.generate(
            [
                GenerationRequest(
                    "The capital of France is", SamplingParams(temperature=0, max_new_tokens=4)
                )
            ],
            progress=False,
        )[0]
    ]
