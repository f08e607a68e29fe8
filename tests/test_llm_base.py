"""Pure parts of dpsynth.llm: parameters, requests, keys, batching plan, fallback template."""

from __future__ import annotations

import pytest

from dpsynth.llm.base import (
    FALLBACK_STOPS,
    GenerationError,
    GenerationRequest,
    SamplingParams,
    apply_stops,
    render_chat_fallback,
    request_key,
)
from dpsynth.llm.batching import batch_seed, plan_batches
from dpsynth.llm.cache import request_keys
from dpsynth.llm.openai_compat import _Transient, _Wait, parse_retry_after


def test_sampling_params_validation_and_dict() -> None:
    p = SamplingParams(temperature=0.7, stop=["\n"], seed=3)
    assert p.stop == ("\n",)
    assert p.to_dict() == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "max_new_tokens": 64,
        "stop": ["\n"],
        "seed": 3,
    }
    assert p.without_seed().seed is None
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_request_validation_names_the_field() -> None:
    r = GenerationRequest([{"role": "user", "content": "hi"}])
    assert r.is_chat and isinstance(r.prompt, tuple)
    with pytest.raises(ValueError, match=r"prompt\[0\]\.role"):
        GenerationRequest(({"role": "robot", "content": "x"},))
    with pytest.raises(TypeError):
        GenerationRequest(42)  # type: ignore[arg-type]


def test_fallback_template_and_stops() -> None:
    text = render_chat_fallback(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}]
    )
    assert text == "System: Be brief.\n\nUser: Hi\n\nAssistant:"
    assert apply_stops("a b\nUser: c", FALLBACK_STOPS) == "a b"
    assert apply_stops("xyz", ("q",)) == "xyz"
    assert apply_stops("one. two. three", (". t", "two")) == "one"


def test_request_keys_cover_every_field_and_duplicates() -> None:
    base = GenerationRequest("p", SamplingParams(seed=1))
    k = request_key("local:a", base)
    assert k != request_key("local:b", base)
    assert k != request_key("local:a", GenerationRequest("q", SamplingParams(seed=1)))
    assert k != request_key("local:a", GenerationRequest("p", SamplingParams(seed=2)))
    assert k != request_key("local:a", GenerationRequest("p", SamplingParams(seed=1), nonce=1))
    keys = request_keys("local:a", [base, base, base])
    assert len(set(keys)) == 3 and keys[0] == k
    assert request_keys("local:a", [base, base]) == keys[:2]  # stable across calls


def test_plan_batches_groups_mixed_params() -> None:
    a = SamplingParams(temperature=0.5)
    b = SamplingParams(temperature=1.0, max_new_tokens=8)
    reqs = [GenerationRequest(str(i), a if i % 2 == 0 else b) for i in range(10)]
    # Seeds differ per request but must not split the groups.
    reqs = [
        GenerationRequest(r.prompt, SamplingParams(**{**r.params.to_dict(), "seed": i}))
        for i, r in enumerate(reqs)
    ]
    batches = plan_batches(reqs, 4)
    assert batches == [[0, 2, 4, 6], [8], [1, 3, 5, 7], [9]]
    assert sorted(i for b in batches for i in b) == list(range(10))


def test_batch_seed() -> None:
    assert batch_seed([None, None]) is None
    assert batch_seed([1, 2]) == batch_seed([1, 2]) != batch_seed([2, 1])
    assert 0 <= batch_seed([1, None]) < 2**63


def test_retry_helpers() -> None:
    import tenacity

    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    wait = _Wait(0.5, 4.0, max_retry_after=10.0)  # tenacity full jitter + Retry-After

    def delay(attempt: int, retry_after: float | None) -> float:
        rs = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        rs.attempt_number = attempt
        exc = _Transient(503, "HTTP 503", retry_after)
        rs.set_exception((_Transient, exc, None))
        return wait(rs)

    assert all(0 <= delay(a, None) <= min(4.0, 0.5 * 2 ** (a - 1)) for a in range(1, 9))
    assert delay(1, 7.0) == 7.0 and delay(1, 300.0) == 10.0  # honoured, capped


def test_generation_error_fields() -> None:
    e = GenerationError("boom", completed=2, total=3, status=503)
    assert isinstance(e, RuntimeError) and (e.completed, e.total, e.status) == (2, 3, 503)


def test_load_generator_specs(tmp_path) -> None:
    from dpsynth.llm import Generator, load_generator
    from dpsynth.llm.cache import CachedGenerator
    from dpsynth.llm.openai_compat import OpenAIGenerator

    spec = {
        "backend": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "model": "m",
        "api_key_env": None,
        "chat": False,
    }
    gen = load_generator(spec)
    assert isinstance(gen, OpenAIGenerator) and isinstance(gen, Generator)
    assert gen.name == "openai:m" and gen.supports_chat is False
    cached = load_generator(spec, cache_path=tmp_path / "c.sqlite")
    assert isinstance(cached, CachedGenerator) and cached.name == "openai:m"
    assert cached.base_url == "http://127.0.0.1:9/v1"  # attributes pass through
    with pytest.raises(ValueError, match="unknown openai keys"):
        load_generator({**spec, "temperature": 1})
    with pytest.raises(ValueError, match="unknown backend"):
        load_generator({"backend": "nope"})
    with pytest.raises(ValueError, match="local transformers model directory"):
        load_generator(str(tmp_path / "missing"))
