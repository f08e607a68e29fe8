"""The OpenAI-compatible backend: retries, time budget, circuit breaker (fast, over a fake
generator behind the real server and a fault-injecting proxy on loopback), and the real
dpsynth server over SmolLM2 (marked ``models``)."""

from __future__ import annotations

import socket

import httpx
import pytest

from dpsynth.config import GeneratorConfig
from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams, load_generator
from dpsynth.llm.cache import CachedGenerator, RequestCache
from dpsynth.llm.openai_compat import CircuitBreaker, OpenAIGenerator, parse_retry_after
from dpsynth.llm.server import create_app
from fault_proxy import FakeGenerator, FaultProxy, running

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
CHAT = ({"role": "user", "content": "Say hello."},)


def client(url: str, model: str = "echo", **kw) -> OpenAIGenerator:
    """Our client for the served model name (``echo``: the fake behind the real server)."""
    kw.setdefault("backoff_base", 0.01)
    return OpenAIGenerator(url, model, api_key_env=None, **kw)


def req(i: int) -> GenerationRequest:
    return GenerationRequest(f"note {i}", SamplingParams(max_new_tokens=4, seed=i))


# --------------------------------------------------------------------- fast: fake generator
@pytest.mark.parametrize("fault", ["503", "429", "reset"])
def test_retries_then_success_and_counts(fault: str) -> None:
    slept: list[float] = []
    with running(create_app(FakeGenerator())) as up, FaultProxy(
        up, script=[fault, fault], retry_after=0.25
    ) as proxy:
        gen = client(proxy.url, max_attempts=3)
        gen.sleep = slept.append
        out = gen.generate([req(1)], progress=False)
    assert out == ["echo note 1 seed=1"]
    assert gen.attempts == 3 and gen.retries == 2 and proxy.seen == 3
    assert sum(gen.retry_causes.values()) == 2
    assert len(slept) == 2
    if fault == "429":
        assert all(d >= 0.25 for d in slept)  # Retry-After honoured
    assert gen.retry_counts()["http_retries"] == 2


def test_max_attempts_stops_with_error_naming_finished(tmp_path) -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(
        up, script=["ok", "ok"] + ["503"] * 20
    ) as proxy:
        inner = client(proxy.url, max_concurrency=1, max_attempts=3, breaker_threshold=50)
        inner.sleep = lambda s: None
        cache = RequestCache(tmp_path / "llm.sqlite")
        gen = CachedGenerator(inner, cache)
        reqs = [GenerationRequest(f"Secret note {i}:", GREEDY) for i in range(3)]
        with pytest.raises(GenerationError) as err:
            gen.generate(reqs, progress=False)
    e = err.value
    assert e.status == 503 and e.completed == 2 and e.total == 3
    assert "2 of 3" in str(e) and "after 3 attempt" in str(e) and "Secret" not in str(e)
    assert len(cache) == 2


def test_each_result_reaches_the_cache_as_it_arrives(tmp_path) -> None:
    """Not at the end of the call: a crash mid-call keeps every answer already received."""
    class Counted(FakeGenerator):
        finished = 0

        def generate(self, *args, **kw):  # type: ignore[no-untyped-def]
            out = super().generate(*args, **kw)
            self.finished += 1
            return out

    upstream = Counted(delay=0.5)
    with running(create_app(upstream, max_batch_requests=1)) as url:
        cache = RequestCache(tmp_path / "llm.sqlite")
        gen = CachedGenerator(client(url, max_concurrency=1), cache)
        when: list[tuple[int, int]] = []
        gen.generate([req(i) for i in range(3)], progress=False,
                     on_result=lambda i, t: when.append((len(cache), upstream.finished)))
    assert when[0] == (1, 1)  # the first answer was stored while the next was being made


def test_retry_budget_is_time_not_count() -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(up, script=["503"] * 1000) as p:
        gen = client(p.url, retry_budget_s=0.6, backoff_base=0.05, backoff_max=0.1,
                     breaker_threshold=10_000)
        with pytest.raises(GenerationError, match="HTTP 503"):
            gen.generate([req(0)], progress=False)
    assert gen.attempts > 3  # many attempts fitted in the budget; no fixed count of 6


def test_hang_is_cut_by_the_timeout_and_retried() -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(up, script=["hang"]) as proxy:
        gen = client(proxy.url, timeout=1.0)
        out = gen.generate([req(2)], progress=False)
    assert out == ["echo note 2 seed=2"] and gen.retry_causes["timeout"] == 1


def test_breaker_waits_out_an_outage_then_recovers() -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(up, script=["503"] * 6) as p:
        gen = client(p.url, max_concurrency=1, breaker_threshold=3, probe_interval_s=0.05,
                     outage_patience_s=30, retry_budget_s=5)
        out = gen.generate([req(i) for i in range(4)], progress=False)
    assert out == [f"echo note {i} seed={i}" for i in range(4)]
    assert gen.breaker.openings >= 1 and not gen.breaker.is_open
    assert gen.retries == 6


def test_breaker_gives_up_after_patience_and_keeps_finished(tmp_path) -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(
        up, script=["ok"] + ["503"] * 10_000
    ) as proxy:
        inner = client(proxy.url, max_concurrency=2, breaker_threshold=3, probe_interval_s=0.05,
                       outage_patience_s=0.5, retry_budget_s=3600)
        cache = RequestCache(tmp_path / "llm.sqlite")
        with pytest.raises(GenerationError, match="outage_patience_s") as err:
            CachedGenerator(inner, cache).generate([req(i) for i in range(5)], progress=False)
    assert err.value.completed == 1 and "1 of 5" in str(err.value) and len(cache) == 1
    assert inner.breaker.tripped


def test_a_failed_call_stops_the_other_requests_retrying() -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(
        up, script=["400"] + ["503"] * 1000
    ) as proxy:
        gen = client(proxy.url, max_concurrency=2, retry_budget_s=60, backoff_base=0.5,
                     breaker_threshold=10_000)
        with pytest.raises(GenerationError, match="HTTP 400") as err:
            gen.generate([req(0), req(1)], progress=False)
    assert err.value.status == 400 and err.value.completed == 0
    assert gen.attempts <= 4  # the other request gave up rather than retry for 60 s


def test_breaker_unit() -> None:
    now = [0.0]
    b = CircuitBreaker(threshold=2, patience_s=10, probe_interval_s=1, clock=lambda: now[0])
    b.failure()
    assert not b.is_open
    b.failure()
    assert b.is_open
    now[0] = 1.5
    assert b.before_attempt() == 0.0  # this caller is the probe
    b.success()
    assert not b.is_open and b.openings == 1


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    gen = client(f"http://127.0.0.1:{port}/v1", max_attempts=2)
    gen.sleep = lambda s: None
    with pytest.raises(GenerationError, match="connection error") as err:
        gen.generate([GenerationRequest("x", GREEDY)], progress=False)
    assert gen.attempts == 2 and gen.retries == 1 and err.value.completed == 0


def test_config_settings_reach_the_client() -> None:
    cfg = GeneratorConfig(backend="openai", base_url="http://127.0.0.1:9/v1", timeout_s=5,
                          retry_budget_s=42, max_attempts=7, outage_patience_s=11)
    gen = load_generator(cfg.spec())
    assert isinstance(gen, OpenAIGenerator)
    assert (gen.timeout, gen.retry_budget_s, gen.max_attempts) == (5, 42, 7)
    assert gen.breaker.patience_s == 11
    with pytest.raises(ValueError, match="unknown openai keys"):
        load_generator({**cfg.spec(), "max_retries": 3})


def test_parse_retry_after() -> None:
    assert parse_retry_after("2") == 2.0 and parse_retry_after(None) is None
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past


# --------------------------------------------------------------------- real model
@pytest.mark.models
def test_chat_and_completions_match_local(smollm) -> None:
    from dpsynth.llm import load_generator

    reqs = [GenerationRequest(CHAT, GREEDY), GenerationRequest("The capital of France is", GREEDY)]
    # the server decodes on the float32 transformers model (per-row seeds in a micro-batch),
    # so its reference is the transformers engine, not the int8 ctranslate2 one
    local = load_generator("smollm2", engine="transformers").generate(reqs, progress=False)
    with running(create_app(smollm, model_id="smollm2")) as url:
        models = httpx.get(f"{url}/models").json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        gen = client(url, "smollm2", max_concurrency=2)
        assert gen.generate(reqs, progress=False) == local
        assert gen.attempts == 2 and gen.retries == 0 and gen.name == "openai:smollm2"
        # A raw completions call with a batch of prompts, as vLLM clients send it.
        body = {
            "model": "smollm2",
            "prompt": ["The capital of France is", "Hi"],
            "max_tokens": 6,
            "temperature": 0,
        }
        raw = httpx.post(f"{url}/completions", json=body, timeout=120).json()
        assert [c["index"] for c in raw["choices"]] == [0, 1]
        assert raw["choices"][0]["text"] == local[1]
        assert raw["usage"]["completion_tokens"] == sum(
            len(smollm.encode(c["text"])) for c in raw["choices"]
        )


@pytest.mark.models
def test_server_rejects_bad_and_oversized_requests(smollm) -> None:
    with running(create_app(smollm, max_body_bytes=2000)) as url:
        big = httpx.post(f"{url}/completions", json={"prompt": "x" * 5000})
        assert big.status_code == 413
        bad = httpx.post(f"{url}/chat/completions", json={"messages": "nope"})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
        echo = httpx.post(f"{url}/completions", json={"prompt": "a", "echo": True})
        assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"


@pytest.mark.models
def test_aug_pe_run_through_an_openai_compatible_server(smollm, tmp_path, monkeypatch) -> None:
    """A whole `generate` run whose generator is an OpenAI-compatible endpoint (config
    `backend: openai`): the same loop, the same accounting, the release written."""
    import json
    from pathlib import Path

    import yaml

    from dpsynth.api import run_generation

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    raw = yaml.safe_load((Path(__file__).parents[1] / "examples" / "tiny-aug-pe.yaml")
                         .read_text())
    # short texts (a declared public length band, so none is refused as too short): the
    # transport is under test here, not the length estimate
    raw["synthesis"].update(samples=6, iterations=1, min_words=4, max_words=12)
    with running(create_app(smollm)) as url:
        raw["generators"] = [{"backend": "openai", "base_url": url, "model": "smollm2",
                              "max_new_tokens": 16, "max_concurrency": 2}]
        cfg = tmp_path / "openai.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        run = run_generation(cfg, tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (run / "release" / "synthetic.jsonl").read_text()
            .splitlines()]
    assert 1 <= len(rows) <= 6 and {r["generator"] for r in rows} == {"smollm2"}
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert 0 < privacy["epsilon"] <= 4.0 + 1e-6
    summary = json.loads((run / "release" / "summary.json").read_text())
    assert summary["llm_calls"] == summary["sent"] > 0  # every request went over HTTP
