"""Gemma 3 270M (base model, GGUF) by name. Named zz so that it runs last: its first load
de-quantises ~250 MB of weights."""

from __future__ import annotations

import pytest

from dpsynth.llm import GenerationRequest, SamplingParams, load_generator

pytestmark = pytest.mark.models


def test_gemma3_loads_by_name_and_generates() -> None:
    gen = load_generator("gemma3")
    assert gen.name == "local:gemma3" and gen.supports_chat is False
    p = SamplingParams(temperature=0.0, max_new_tokens=6)
    chat = ({"role": "user", "content": "What is the capital of France?"},)
    plain, via_fallback = gen.generate(
        [GenerationRequest("The capital of France is", p), GenerationRequest(chat, p)],
        progress=False,
    )
    assert plain.strip() and via_fallback.strip()
    assert "User:" not in via_fallback
    # Greedy: the first generated token is the arg-max of the model's next-token logits.
    logits = gen.next_token_logits(["The capital of France is"])
    assert gen.encode(plain)[0] == int(logits[0].argmax())
