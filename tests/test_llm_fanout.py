"""Generation across several OpenAI-compatible endpoints (issue 15, point 6): requests spread
with a concurrency bound per endpoint, failed attempts retried at once on another endpoint,
"outage" = every endpoint down, and cache keys that do not name an endpoint. Fast tests run
fake in-process servers on loopback (the real server app over a fake model, behind the
fault-injecting proxy); one test kills a real ``dpsynth llm serve`` over SmolLM2 mid-run
(marked ``models``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
import yaml

from dpsynth.config import GeneratorConfig
from dpsynth.llm import GenerationError, GenerationRequest, SamplingParams, load_generator
from dpsynth.llm.cache import CachedGenerator, RequestCache, request_keys
from dpsynth.llm.fanout import EndpointPool, PoolAborted
from dpsynth.llm.openai_compat import OpenAIGenerator
from dpsynth.llm.server import create_app
from fault_proxy import FakeGenerator, FaultProxy, free_port, running

REPO = Path(__file__).resolve().parents[1]


class Counting:
    """ASGI wrapper: counts POSTs and the most in flight at once (what one server saw)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.posts = 0
        self.now = 0
        self.peak = 0
        self.lock = threading.Lock()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        with self.lock:
            self.posts += 1
            self.now += 1
            self.peak = max(self.peak, self.now)
        done = False

        async def sending(message: dict) -> None:
            nonlocal done
            if message["type"] == "http.response.body" and not message.get("more_body"):
                with self.lock:  # before the client can have the answer
                    self.now -= 1
                done = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not done:
                with self.lock:
                    self.now -= 1


def fanout(urls: list[str], **kw: Any) -> OpenAIGenerator:
    kw.setdefault("backoff_base", 0.01)
    return OpenAIGenerator(None, "echo", base_urls=urls, api_key_env=None, **kw)


def req(i: int) -> GenerationRequest:
    return GenerationRequest(f"note {i}", SamplingParams(max_new_tokens=4, seed=i))


def expected(i: int) -> str:
    return f"echo note {i} seed={i}"


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there


# --------------------------------------------------------------------- fast: routing
def test_requests_spread_with_bounded_concurrency_per_endpoint() -> None:
    a, b = Counting(create_app(FakeGenerator(delay=0.02))), Counting(create_app(
        FakeGenerator(delay=0.02)))
    with running(a) as ua, running(b) as ub:
        gen = fanout([ua, ub], max_concurrency=2)
        out = gen.generate([req(i) for i in range(24)], progress=False)
    assert out == [expected(i) for i in range(24)]
    assert a.posts > 0 and b.posts > 0 and a.posts + b.posts == 24
    assert a.peak <= 2 and b.peak <= 2  # the bound holds per endpoint
    assert a.peak + b.peak > 2  # ... and both endpoints worked at once
    counts = gen.endpoint_counts()
    assert [counts[u]["served"] for u in (ua, ub)] == [a.posts, b.posts]
    assert gen.retries == 0 and gen.retry_counts()["endpoints"] == 2


@pytest.mark.parametrize("fault", ["503", "reset", "hang"])
def test_a_failing_endpoint_fails_over_at_once_and_nobody_pays_twice(fault: str) -> None:
    slept: list[float] = []
    with running(create_app(FakeGenerator())) as up_a, running(
        create_app(FakeGenerator())
    ) as up_b, FaultProxy(up_a, script=["ok", "ok"], rates={fault: 1.0}, hang_s=30) as pa, \
            FaultProxy(up_b) as pb:
        gen = fanout([pa.url, pb.url], max_concurrency=2, timeout=1.0, endpoint_cooldown_s=60)
        gen.sleep = slept.append
        out = gen.generate([req(i) for i in range(16)], progress=False)
    assert out == [expected(i) for i in range(16)]
    assert pa.faults[fault] >= 1 and gen.failovers == gen.retries == sum(pa.faults.values())
    assert slept == [0.0] * gen.retries  # a failover does not back off: another one was up
    assert gen.breaker.openings == 0  # one endpoint down is no outage
    paid = pa.upstream_ok + pb.upstream_ok
    assert sum(paid.values()) == 16 and max(paid.values()) == 1  # each request paid once
    counts = gen.endpoint_counts()
    assert not counts[pa.url]["up"] and counts[pb.url]["up"]
    assert counts[pa.url]["served"] == 2 and counts[pb.url]["served"] == 14


def test_an_endpoint_killed_mid_run_and_a_resume_elsewhere_pays_nothing_twice(tmp_path) -> None:
    cache_path = tmp_path / "llm.sqlite"
    reqs = [req(i) for i in range(20)]
    with running(create_app(FakeGenerator(delay=0.05))) as up_a, running(
        create_app(FakeGenerator(delay=0.05))
    ) as up_b, FaultProxy(up_a) as pa, FaultProxy(up_b) as pb:
        inner = fanout([pa.url, pb.url], max_concurrency=2)
        gen = CachedGenerator(inner, RequestCache(cache_path))
        seen: list[int] = []
        killed = threading.Event()

        def on_result(i: int, text: str) -> None:
            seen.append(i)
            counts = inner.endpoint_counts()
            if not killed.is_set() and counts[pa.url]["served"] >= 2 and \
                    counts[pb.url]["served"] >= 2:
                killed.set()  # stop endpoint A: later connections are refused
                pa.stop()  # returns once it no longer listens

        out = gen.generate(reqs, progress=False, on_result=on_result)
        served_a_before = inner.endpoint_counts()[pa.url]["served"]
    assert killed.is_set() and out == [expected(i) for i in range(20)]
    assert served_a_before >= 2 and pb.upstream_ok
    assert gen.delivered == 20 == len(gen.cache) and sorted(seen) == list(range(20))
    assert inner.failovers >= 1 and inner.endpoint_counts()[pa.url]["failed"] >= 1

    # Resume against another endpoint set: the cache key names the model, not the endpoints.
    other = Counting(create_app(FakeGenerator()))
    with running(other) as uc:
        inner2 = fanout([uc, dead_url()], max_concurrency=2)
        assert inner2.name == inner.name
        assert request_keys(inner2.name, reqs) == request_keys(inner.name, reqs)
        gen2 = CachedGenerator(inner2, RequestCache(cache_path))
        out2 = gen2.generate(reqs + [req(20), req(21)], progress=False)
    assert out2 == [expected(i) for i in range(22)]
    assert (gen2.hits, gen2.misses, gen2.delivered) == (20, 2, 2)
    assert other.posts + inner2.endpoint_counts()[inner2.base_urls[1]]["failed"] == \
        inner2.attempts and other.posts == 2  # only the two new requests were sent


def test_every_endpoint_down_is_the_breakers_outage() -> None:
    gen = fanout([dead_url(), dead_url()], max_concurrency=2, breaker_threshold=3,
                 probe_interval_s=0.05, outage_patience_s=0.5, retry_budget_s=3600,
                 endpoint_cooldown_s=0.05)
    with pytest.raises(GenerationError, match="outage_patience_s") as err:
        gen.generate([GenerationRequest("Secret note", SamplingParams()) for _ in range(3)],
                     progress=False)
    msg = str(err.value)
    assert "2 endpoints" in msg and all(u in msg for u in gen.base_urls)
    assert "0 of 3" in msg and "Secret" not in msg
    assert gen.breaker.tripped
    assert all(c["failed"] >= 1 and c["served"] == 0 for c in gen.endpoint_counts().values())


def test_endpoints_all_down_then_one_recovers() -> None:
    with running(create_app(FakeGenerator())) as up, FaultProxy(
        up, script=["503"] * 3
    ) as pa, FaultProxy(up, script=["503"] * 3) as pb:
        gen = fanout([pa.url, pb.url], max_concurrency=1, breaker_threshold=2,
                     probe_interval_s=0.05, endpoint_cooldown_s=0.05, outage_patience_s=30)
        out = gen.generate([req(i) for i in range(4)], progress=False)
    assert out == [expected(i) for i in range(4)]
    assert gen.breaker.openings >= 1 and not gen.breaker.is_open
    assert gen.retries == 6


def test_pool_unit_least_busy_cooldown_and_all_down() -> None:
    now = [0.0]
    pool = EndpointPool(["a", "b"], lambda u: None, max_concurrency=1, cooldown_s=1.0,
                        max_cooldown_s=3.0, clock=lambda: now[0])
    a, _ = pool.acquire()
    b, _ = pool.acquire()
    assert (a.url, b.url) == ("a", "b")
    abort = threading.Event()
    abort.set()
    with pytest.raises(PoolAborted):
        pool.acquire(abort)  # both full
    pool.release(a)
    pool.release(b)
    assert pool.failure(a, "HTTP 503") is True  # b is still up
    assert [pool.acquire()[0].url for _ in range(1)] == ["b"]
    pool.release(b)
    now[0] = 1.5  # a's first cool-down (1 s) is over
    a2, _ = pool.acquire()
    assert a2 is a
    pool.release(a)
    pool.failure(a, "timeout")
    pool.failure(a, "timeout")  # doubling: 2 s, then 4 s capped at 3 s
    assert a.down_until == pytest.approx(4.5)
    assert pool.failure(b, "reset", retry_after=10.0) is False  # nobody else is up
    assert b.down_until == pytest.approx(11.5)
    assert pool.acquire()[0] is a  # all down: the one that recovers first
    assert pool.counts()["a"] == {"served": 0, "failed": 3, "causes": {"HTTP 503": 1,
                                  "timeout": 2}, "peak_in_flight": 1, "up": False}


def test_config_and_spec_take_a_list_of_endpoints() -> None:
    cfg = GeneratorConfig(backend="openai", model="m", base_urls=["http://h1:8000/v1/",
                          "http://h2:8000/v1"], max_concurrency=3, endpoint_cooldown_s=2)
    gen = load_generator(cfg.spec())
    assert isinstance(gen, OpenAIGenerator)
    assert gen.base_urls == ["http://h1:8000/v1", "http://h2:8000/v1"]
    assert gen.pool.max_concurrency == 3 and gen.pool.cooldown_s == 2
    assert gen.name == "openai:m" == load_generator({**cfg.spec(), "base_urls": None,
                                                     "base_url": "http://h3/v1"}).name
    with pytest.raises(pydantic.ValidationError, match="not both"):
        GeneratorConfig(backend="openai", base_url="http://a/v1", base_urls=["http://b/v1"])
    with pytest.raises(pydantic.ValidationError, match="twice"):
        GeneratorConfig(backend="openai", base_urls=["http://a/v1", "http://a/v1"])
    with pytest.raises(pydantic.ValidationError):
        GeneratorConfig(backend="openai", base_urls=[])
    with pytest.raises(ValueError, match="http://"):
        load_generator({"backend": "openai", "model": "m", "base_urls": ["h1:8000"]})
    with pytest.raises(ValueError, match="base_url' or 'base_urls"):
        load_generator({"backend": "openai", "model": "m"})


def test_a_run_through_two_endpoints_then_a_new_endpoint_pays_no_call(tmp_path,
                                                                       monkeypatch) -> None:
    """The production path: a config with `base_urls` through run_generation; one endpoint is
    stopped mid-run; a second run with the same seed over a different endpoint and the same
    request cache is answered wholly from the cache."""
    from dpsynth.api import run_generation
    from fakes import FakeEmbedder
    from fakes import FakeGenerator as TextFake

    raw = yaml.safe_load((REPO / "examples" / "tiny-aug-pe.yaml").read_text())
    raw["privacy"].update(noise="seeded", seed=5)
    raw["synthesis"].update(samples=6, iterations=1)
    raw["llm_cache"] = str(tmp_path / "shared-cache.sqlite")

    def config(name: str, urls: list[str]) -> Path:
        raw["generators"] = [{"backend": "openai", "model": "g0", "base_urls": urls,
                              "max_new_tokens": 24, "max_concurrency": 2}]
        path = tmp_path / name
        path.write_text(yaml.safe_dump(raw))
        return path

    with running(create_app(TextFake("g0"))) as up_a, running(
        create_app(TextFake("g0"))
    ) as up_b, FaultProxy(up_a) as pa, FaultProxy(up_b) as pb:
        stop = threading.Event()

        def kill_a_midway() -> None:
            while not stop.is_set():
                if pa.upstream_ok and pb.upstream_ok and pa.seen >= 4:
                    pa.stop()
                    return
                time.sleep(0.005)

        watcher = threading.Thread(target=kill_a_midway, daemon=True)
        watcher.start()
        monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger1.json"))
        try:
            run1 = run_generation(config("two.yaml", [pa.url, pb.url]), tmp_path / "r1",
                                  progress=False, embedder=FakeEmbedder())
        finally:
            stop.set()
            watcher.join()
    s1 = json.loads((run1 / "release" / "summary.json").read_text())
    assert pa.upstream_ok and pb.upstream_ok and not pa._thread.is_alive()  # A was stopped
    assert s1["http_retries"] >= 1  # requests sent to the stopped endpoint went elsewhere
    assert s1["llm_calls"] > 0 and s1["llm_calls"] == len(RequestCache(tmp_path /
                                                                        "shared-cache.sqlite"))

    other = Counting(create_app(TextFake("g0")))
    with running(other) as uc:
        monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger2.json"))
        run2 = run_generation(config("other.yaml", [uc]), tmp_path / "r2", progress=False,
                              embedder=FakeEmbedder())
    s2 = json.loads((run2 / "release" / "summary.json").read_text())
    assert other.posts == 0 and s2["llm_calls"] == 0
    assert (run2 / "release" / "synthetic.jsonl").read_text() == \
        (run1 / "release" / "synthetic.jsonl").read_text()


# --------------------------------------------------------------------- real servers
@contextlib.contextmanager
def llm_serve(port: int, log: Path) -> Iterator[subprocess.Popen]:
    """`dpsynth llm serve --model smollm2` on 127.0.0.1:port (a real subprocess)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dpsynth", "llm", "serve", "--model", "smollm2",
             "--host", "127.0.0.1", "--port", str(port), "--max-batch", "4"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError("server did not start in time")


@pytest.mark.models
def test_two_real_servers_one_killed_mid_run(tmp_path) -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}/v1" for p in ports]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    reqs = [GenerationRequest(f"Write one word about topic {i}:",
                              SamplingParams(temperature=0.7, max_new_tokens=6, seed=i))
            for i in range(16)]
    with llm_serve(ports[0], logs[0]) as a, llm_serve(ports[1], logs[1]) as b:
        wait_ready(urls[0], a, logs[0])
        wait_ready(urls[1], b, logs[1])
        inner = OpenAIGenerator(None, "smollm2", base_urls=urls, api_key_env=None,
                                max_concurrency=2, timeout=60, backoff_base=0.05,
                                endpoint_cooldown_s=30)
        gen = CachedGenerator(inner, RequestCache(tmp_path / "llm.sqlite"))
        before: dict[str, int] = {}

        def on_result(i: int, text: str) -> None:
            counts = inner.endpoint_counts()
            if not before and all(counts[u]["served"] >= 1 for u in urls):
                before.update({u: counts[u]["served"] for u in urls})
                a.send_signal(signal.SIGKILL)  # endpoint A dies mid-run

        out = gen.generate(reqs, progress=False, on_result=on_result)
        a.wait(timeout=30)
        after = inner.endpoint_counts()
    assert before and all(v >= 1 for v in before.values())  # both served before the kill
    assert a.returncode == -signal.SIGKILL
    assert len(out) == 16 and all(isinstance(t, str) for t in out)
    assert gen.delivered == 16 == len(gen.cache)  # the run completed; every request cached once
    assert after[urls[1]]["served"] > before[urls[1]]  # the survivor took the rest
    assert after[urls[0]]["failed"] >= 1 and inner.failovers >= 1 and not after[urls[0]]["up"]
    assert sum(c["served"] for c in after.values()) == 16  # no request answered twice
