"""`dpsynth llm serve`: micro-batching, a bounded queue that pushes back (429/503 with
Retry-After), and per-request seeds inside batches; over real HTTP on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams
from dpsynth.llm.server import create_app
from fault_proxy import FakeGenerator, running


def body(i: int, seed: int | None = None, model: str = "echo") -> dict:
    b = {"model": model, "prompt": f"p{i}", "max_tokens": 8, "temperature": 1.0}
    if seed is not None:
        b["seed"] = seed
    return b


async def _burst(url: str, bodies: list[dict], timeout: float) -> list[httpx.Response | str]:
    """Send all bodies at once; a request that gets no answer within ``timeout`` is 'timeout'."""
    async with httpx.AsyncClient(timeout=timeout,
                                 limits=httpx.Limits(max_connections=len(bodies))) as c:

        async def one(b: dict) -> httpx.Response | str:
            try:
                return await c.post(f"{url}/completions", json=b)
            except httpx.TimeoutException:
                return "timeout"

        return await asyncio.gather(*(one(b) for b in bodies))


def burst(url: str, bodies: list[dict], timeout: float = 20.0) -> list[httpx.Response | str]:
    return asyncio.run(_burst(url, bodies, timeout))


def test_concurrent_requests_are_batched_and_answered_each_their_own() -> None:
    gen = FakeGenerator(delay=0.3)
    app = create_app(gen, max_batch_requests=32, batch_window_s=0.05)
    with running(app) as url:
        out = burst(url, [body(i, seed=100 + i) for i in range(16)])
    assert all(not isinstance(r, str) and r.status_code == 200 for r in out)
    texts = [r.json()["choices"][0]["text"] for r in out]  # type: ignore[union-attr]
    assert texts == [f"echo p{i} seed={100 + i}" for i in range(16)]
    assert max(gen.batches) > 1 and sum(gen.batches) == 16
    assert len(gen.batches) < 16  # fewer generate calls than requests
    # the server's own counters (what `dpsynth bench serving` reports) agree with the generator
    batcher = app.state.batcher
    assert (batcher.generate_calls, batcher.completions) == (len(gen.batches), 16)


def test_batch_size_one_is_the_old_server() -> None:
    gen = FakeGenerator(delay=0.02)
    with running(create_app(gen, max_batch_requests=1)) as url:
        out = burst(url, [body(i) for i in range(6)])
    assert all(not isinstance(r, str) and r.status_code == 200 for r in out)
    assert gen.batches == [1] * 6


def test_full_queue_answers_429_with_retry_after() -> None:
    gen = FakeGenerator(delay=0.5)
    app = create_app(gen, max_batch_requests=2, max_pending=3, retry_after_s=2)
    with running(app) as url:
        out = burst(url, [body(i) for i in range(12)])
        too_big = httpx.post(f"{url}/completions", json={"prompt": ["a"] * 4, "max_tokens": 2})
    assert too_big.status_code == 400  # could never be queued: an error, not a retry
    codes = [r if isinstance(r, str) else r.status_code for r in out]
    assert "timeout" not in codes and set(codes) <= {200, 429}
    busy = [r for r in out if not isinstance(r, str) and r.status_code == 429]
    assert busy and all(r.headers["Retry-After"] == "2" for r in busy)
    assert app.state.batcher.rejected == len(busy)


def test_request_queued_past_its_deadline_gets_503() -> None:
    gen = FakeGenerator(delay=0.6)
    app = create_app(gen, max_batch_requests=1, queue_timeout_s=0.2, batch_window_s=0)
    with running(app) as url:
        out = burst(url, [body(i) for i in range(4)])
    codes = [r if isinstance(r, str) else r.status_code for r in out]
    assert codes.count(200) >= 1 and 503 in codes and "timeout" not in codes
    late = [r for r in out if not isinstance(r, str) and r.status_code == 503]
    assert all("Retry-After" in r.headers for r in late)
    assert sum(gen.batches) == codes.count(200)  # an expired request was never generated


def test_a_request_whose_client_hung_up_in_the_queue_is_never_generated() -> None:
    """A client that gives up while its request waits behind a busy model (its own timeout)
    has the request dropped: the model computes only what someone still waits for, so a
    client's timeout-and-resend does not pile duplicate work on a slow server."""
    gen = FakeGenerator(delay=1.5)
    app = create_app(gen, max_batch_requests=1, batch_window_s=0, queue_timeout_s=60)

    async def scene(url: str) -> tuple[httpx.Response, str]:
        async with httpx.AsyncClient(timeout=20) as c:
            busy = asyncio.create_task(c.post(f"{url}/completions", json=body(1)))
            await asyncio.sleep(0.4)  # the model is now generating p1
            try:
                await c.post(f"{url}/completions", json=body(2), timeout=0.3)
                gave_up = "answered"
            except httpx.TimeoutException:
                gave_up = "timeout"
            return await busy, gave_up

    with running(app) as url:
        first, gave_up = asyncio.run(scene(url))
        assert first.status_code == 200 and gave_up == "timeout"
        after = httpx.post(f"{url}/completions", json=body(3), timeout=20)
    assert after.status_code == 200
    assert gen.batches == [1, 1]  # p1 and p3: p2's client had hung up while it was queued
    assert app.state.batcher.completions == 2


def test_load_no_request_waits_past_its_timeout_unanswered() -> None:
    """Bounded load: 96 requests from 32 concurrent clients, each with a 10 s timeout."""
    gen = FakeGenerator(delay=0.05)
    app = create_app(gen, max_batch_requests=8, max_pending=16, queue_timeout_s=3)
    with running(app) as url:
        out: list[httpx.Response | str] = []
        for round_ in range(3):
            out += burst(url, [body(32 * round_ + i) for i in range(32)], timeout=10)
    codes = [r if isinstance(r, str) else r.status_code for r in out]
    assert len(codes) == 96 and "timeout" not in codes
    assert set(codes) <= {200, 429, 503} and codes.count(200) >= 16


def test_generator_failure_is_500_without_prompt_text() -> None:
    class Broken(FakeGenerator):
        def generate(self, requests, *, progress=True, on_result=None):  # type: ignore[override]
            raise GenerationError("fake: model.generate failed (RuntimeError)")

    with running(create_app(Broken())) as url:
        r = httpx.post(f"{url}/completions", json={"prompt": "Secret text", "max_tokens": 4})
    assert r.status_code == 500 and "Secret" not in r.text and "RuntimeError" in r.text


@pytest.mark.models
def test_seeds_hold_inside_batches_and_batching_saves_forward_passes(smollm) -> None:
    """A seeded request gives the same text alone or batched with others (its own random
    stream); 32 concurrent clients need >= 3x fewer forward passes than one at a time (the
    wall-clock throughput is measured by benchmarks/bench_serving.py)."""
    calls = {"n": 0}
    real = smollm.forward_last

    def counted(*a, **kw):
        calls["n"] += 1
        return real(*a, **kw)

    smollm.forward_last = counted
    try:
        bodies = [dict(body(i, seed=7 + i, model="smollm2"), max_tokens=6) for i in range(32)]
        with running(create_app(smollm, max_batch_requests=1)) as url:
            alone = burst(url, bodies[:4], timeout=300)
        with running(create_app(smollm, max_batch_requests=32, batch_window_s=0.2)) as url:
            calls["n"] = 0
            batched = burst(url, bodies, timeout=300)
            batched_calls = calls["n"]
        assert all(not isinstance(r, str) and r.status_code == 200 for r in alone + batched)
        texts = [r.json()["choices"][0]["text"] for r in batched]  # type: ignore[union-attr]
        assert texts[:4] == [r.json()["choices"][0]["text"] for r in alone]  # type: ignore
        assert len(set(texts)) > 20  # different seeds, different samples
        # one at a time: one forward per new token per request (>= 1 per request).
        calls["n"] = 0
        smollm_reqs = [GenerationRequest(b["prompt"], SamplingParams(max_new_tokens=6,
                                                                     seed=b["seed"]))
                       for b in bodies]
        from dpsynth.llm.server import decode_rows

        for r in smollm_reqs:
            decode_rows(smollm, [r])
        assert calls["n"] >= 3 * batched_calls
    finally:
        smollm.forward_last = real
