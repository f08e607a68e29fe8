"""The OpenAI-compatible backend against the real dpsynth server on 127.0.0.1 over SmolLM2."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams
from dpsynth.llm.cache import CachedGenerator, RequestCache
from dpsynth.llm.openai_compat import OpenAIGenerator
from dpsynth.llm.server import create_app

pytestmark = pytest.mark.models

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
CHAT = ({"role": "user", "content": "Say hello."},)


@contextlib.contextmanager
def running(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a free loopback port; yield the /v1 URL."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def client(url: str, **kw) -> OpenAIGenerator:
    kw.setdefault("backoff_base", 0.01)
    return OpenAIGenerator(url, "smollm2", api_key_env=None, **kw)


def test_chat_and_completions_match_local(smollm) -> None:
    reqs = [GenerationRequest(CHAT, GREEDY), GenerationRequest("The capital of France is", GREEDY)]
    local = smollm.generate(reqs, progress=False)
    with running(create_app(smollm, model_id="smollm2")) as url:
        models = httpx.get(f"{url}/models").json()
        assert [m["id"] for m in models["data"]] == ["smollm2"]
        gen = client(url, max_concurrency=2)
        assert gen.generate(reqs, progress=False) == local
        assert gen.attempts == 2 and gen.name == "openai:smollm2"
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


def test_server_rejects_bad_and_oversized_requests(smollm) -> None:
    with running(create_app(smollm, max_body_bytes=2000)) as url:
        big = httpx.post(f"{url}/completions", json={"prompt": "x" * 5000})
        assert big.status_code == 413
        bad = httpx.post(f"{url}/chat/completions", json={"messages": "nope"})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
        stream = httpx.post(f"{url}/completions", json={"prompt": "a", "stream": True})
        assert stream.status_code == 400


@pytest.mark.parametrize("status", [503, 429])
def test_retries_then_success(smollm, status: int) -> None:
    slept: list[float] = []
    app = create_app(smollm, fail_first_n=2, fail_status=status, retry_after=0.25)
    with running(app) as url:
        gen = client(url, max_retries=3)
        gen.sleep = slept.append
        out = gen.generate([GenerationRequest("The capital of France is", GREEDY)], progress=False)
    assert out == smollm.generate(
        [GenerationRequest("The capital of France is", GREEDY)], progress=False
    )
    assert gen.attempts == 3 and app.state.counters["requests"] == 3
    assert len(slept) == 2 and all(d >= 0.25 for d in slept)  # Retry-After honoured


def test_final_error_keeps_finished_results_in_cache(smollm, tmp_path) -> None:
    reqs = [GenerationRequest(f"Secret note {i}:", GREEDY) for i in range(3)]
    cache = RequestCache(tmp_path / "llm.sqlite")
    with running(create_app(smollm, fail_after=2, fail_status=503)) as url:
        inner = client(url, max_concurrency=1, max_retries=2)
        inner.sleep = lambda s: None
        gen = CachedGenerator(inner, cache)
        with pytest.raises(GenerationError) as err:
            gen.generate(reqs, progress=False)
    e = err.value
    assert e.status == 503 and e.completed == 2 and e.total == 3
    assert "503" in str(e) and "2 of 3" in str(e) and "after 3 attempt" in str(e)
    assert "Secret" not in str(e)
    assert len(cache) == 2
    with running(create_app(smollm)) as url:
        gen2 = CachedGenerator(client(url), cache)
        out = gen2.generate(reqs, progress=False)
    assert (gen2.hits, gen2.misses, gen2.calls) == (2, 1, 1)
    assert out == smollm.generate(reqs, progress=False)


def test_connection_refused_is_retried_then_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    gen = client(f"http://127.0.0.1:{port}/v1", max_retries=1)
    gen.sleep = lambda s: None
    with pytest.raises(GenerationError, match="connection error") as err:
        gen.generate([GenerationRequest("x", GREEDY)], progress=False)
    assert gen.attempts == 2 and err.value.completed == 0


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
    raw["synthesis"].update(samples=6, iterations=1)
    with running(create_app(smollm)) as url:
        raw["generators"] = [{"backend": "openai", "base_url": url, "model": "smollm2",
                              "max_new_tokens": 24, "max_concurrency": 2}]
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
