"""Serving throughput: ``dpsynth llm serve`` one request at a time against micro-batching.

Both modes serve the same loaded model in one process, on 127.0.0.1, to the same burst of
``requests`` completions sent by ``clients`` concurrent clients (bounded in count, and in time
by ``timeout_s`` per request). Sampling with fixed per-request seeds, so both modes decode the
same texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

from ..errors import ComputeError, require

TOPICS = ("a bakery", "a train station", "a library", "a football match", "a hospital",
          "a mountain hike", "a job interview", "a rainy day")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_on_loopback(app: Any, path: str = "", start_timeout_s: float = 60.0
                      ) -> Iterator[str]:
    """``app`` on a free 127.0.0.1 port (uvicorn, a background thread) until the block ends;
    yields ``http://127.0.0.1:PORT`` + ``path`` (also the tests' loopback server)."""
    uvicorn = require("uvicorn", "serve", "serving on loopback")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise ComputeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def _burst(url: str, bodies: list[dict[str, Any]], clients: int,
                 timeout_s: float) -> tuple[list[float], dict[int, str], dict[str, int]]:
    import httpx

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    latencies: list[float] = []
    texts: dict[int, str] = {}
    codes: dict[str, int] = {}
    async with httpx.AsyncClient(timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=clients)) as c:

        async def client() -> None:
            while not queue.empty():
                b = queue.get_nowait()
                t0 = time.perf_counter()
                try:
                    r = await c.post(f"{url}/chat/completions", json=b)
                    key = str(r.status_code)
                    if r.status_code == 200:
                        texts[b["seed"]] = r.json()["choices"][0]["message"]["content"]
                except httpx.TimeoutException:
                    key = "timeout"
                latencies.append(time.perf_counter() - t0)
                codes[key] = codes.get(key, 0) + 1

        await asyncio.gather(*(client() for _ in range(clients)))
    return latencies, texts, codes


def bench_serving(model: str = "smollm2", clients: int = 32, requests: int = 64,
                  tokens: int = 16, max_batch: int = 32, timeout_s: float = 600.0) -> dict:
    """Completions/s of one-at-a-time (max batch 1) and micro-batched serving, side by side."""
    if clients < 1 or requests < 1 or tokens < 1 or max_batch < 1:
        raise ValueError("clients, requests, tokens and max_batch must be >= 1")
    import torch

    from dpsynth.llm import load_generator
    from dpsynth.llm.server import create_app

    gen = load_generator(model)
    bodies = [{"model": model, "seed": i, "temperature": 1.0, "top_p": 0.95,
               "max_tokens": tokens,
               "messages": [{"role": "user",
                             "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]}."}]}
              for i in range(requests)]
    from dpsynth.llm.base import GenerationRequest, SamplingParams
    from dpsynth.llm.server import decode_rows

    decode_rows(gen, [GenerationRequest("Hello", SamplingParams(max_new_tokens=2, seed=0))])
    res: dict[str, Any] = {
        "model": model, "clients": clients, "requests": requests, "max_new_tokens": tokens,
        "max_batch": max_batch, "torch_threads": torch.get_num_threads(),
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
    }
    outputs = {}
    for label, size in (("one_at_a_time", 1), ("micro_batched", max_batch)):
        app = create_app(gen, max_batch_requests=size, max_pending=max(256, requests),
                         queue_timeout_s=timeout_s)
        with serve_on_loopback(app, "/v1") as url:
            t0 = time.perf_counter()
            lat, texts, codes = asyncio.run(_burst(url, bodies, clients, timeout_s))
            wall = time.perf_counter() - t0
        batcher = app.state.batcher
        outputs[label] = texts
        res[label] = {
            "wall_s": round(wall, 2),
            "completions_per_s": round(codes.get("200", 0) / wall, 3),
            "latency_p50_s": round(statistics.median(lat), 2),
            "latency_max_s": round(max(lat), 2),
            "status_counts": codes,
            "generate_calls": batcher.generate_calls,
            "mean_batch": round(batcher.completions / max(1, batcher.generate_calls), 2),
        }
    res["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    res["speedup"] = round(res["micro_batched"]["completions_per_s"]
                           / max(1e-9, res["one_at_a_time"]["completions_per_s"]), 2)
    one, batched = outputs["one_at_a_time"], outputs["micro_batched"]
    same = sum(one[k] == batched.get(k) for k in one)
    res["same_text_both_modes"] = f"{same}/{requests}"
    return res
