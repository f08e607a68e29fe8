"""Test helpers: serve an app on loopback, a fake generator, and a fault-injecting HTTP proxy.

The proxy is test code only (the production server has no fault parameters). It sits on
127.0.0.1 in front of an upstream OpenAI-compatible server and, per request, either forwards it
or injects a fault *before* forwarding (so a fault never costs an upstream generation):
``"503"``, ``"429"`` (with ``Retry-After``), ``"reset"`` (TCP RST), ``"hang"`` (no answer
until the client gives up) or, scripted only, ``"400"``. It counts, per request body
(:func:`body_key`), the attempts it forwarded, the hangs it injected and the upstream 200
answers (the generations paid for), so that a test can check that no request was paid twice
-- or, under CPU load, that each extra payment is an answer the client had given up waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from dpsynth.llm.base import GenerationRequest
from loopback import free_port, serve_in_thread


def running(app: Any) -> contextlib.AbstractContextManager[str]:
    """Serve ``app`` on a free loopback port; yields the /v1 URL."""
    return serve_in_thread(app, "/v1", start_timeout_s=30)


class FakeGenerator:
    """Echoes each prompt; ``delay`` seconds per generate call; records batch sizes."""

    name = "fake:echo"
    supports_chat = True

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[int] = []
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = True,
                 on_result: Any = None) -> list[str]:
        self.calls += 1
        self.batches.append(len(requests))
        if self.delay:
            time.sleep(self.delay)
        out = []
        for r in requests:
            text = r.prompt if isinstance(r.prompt, str) else r.prompt[-1]["content"]
            out.append(f"echo {text} seed={r.params.seed}")
        return out


FAULTS = ("503", "429", "reset", "hang")


def body_key(body: bytes | dict[str, Any]) -> str:
    """A request body's identity: sha256 of its JSON with sorted keys (of the raw bytes when
    they are not JSON), the same for the bytes the proxy reads and the dict a client posts."""
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = json.loads(body)
        except ValueError:
            return hashlib.sha256(body).hexdigest()
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 that injects faults (see the module docstring).

    ``script`` gives the fault of the first requests in order (``"ok"`` forwards); after it,
    each request fails with probability ``rates[kind]`` (independently drawn from ``seed``).
    ``hang_s`` caps a hang (make it longer than the client's timeout, so that every hang ends
    with the client giving up). Counters: ``seen`` (POSTs), ``faults`` (kind -> count); per
    :func:`body_key`: ``hung`` (hangs), ``forwarded`` (attempts sent upstream), ``upstream_ok``
    (upstream 200s, whether or not the client was still waiting for them); and
    ``upstream_failed`` (non-200 upstream answers by status, failed forwards by exception).
    """

    def __init__(self, upstream: str, *, script: Sequence[str] = (),
                 rates: dict[str, float] | None = None, seed: int = 0,
                 retry_after: float = 1.0, hang_s: float = 60.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.script = list(script)
        self.rates = dict(rates or {})
        self.rng = random.Random(seed)
        self.retry_after = retry_after
        self.hang_s = hang_s
        self.seen = 0
        self.faults: Counter[str] = Counter()
        self.hung: Counter[str] = Counter()
        self.forwarded: Counter[str] = Counter()
        self.upstream_ok: Counter[str] = Counter()
        self.upstream_failed: Counter[int | str] = Counter()
        self.lock = threading.Lock()
        self.port = free_port()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._open: set[asyncio.StreamWriter] = set()  # connections being served
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def paid_twice(self) -> int:
        return sum(c - 1 for c in self.upstream_ok.values() if c > 1)

    def _choose(self, key: str) -> str:
        with self.lock:
            self.seen += 1
            if self.script:
                kind = self.script.pop(0)
            else:
                u = self.rng.random()
                kind = "ok"
                for k in FAULTS:
                    p = self.rates.get(k, 0.0)
                    if u < p:
                        kind = k
                        break
                    u -= p
            if kind == "ok":
                self.forwarded[key] += 1
            else:
                self.faults[kind] += 1
                self.hung[key] += kind == "hang"
            return kind

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stop is not None and self._stop.is_set():  # accepted as the proxy stopped
            writer.transport.abort()
            return
        self._open.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            key = body_key(body)
            kind = self._choose(key) if method == "POST" else "ok"
            if kind == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if kind == "hang":
                with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                    await asyncio.wait_for(reader.read(), timeout=self.hang_s)  # until EOF
                writer.transport.abort()
                return
            if kind in ("503", "429", "400"):
                payload = b'{"error": {"message": "injected", "type": "server_error"}}'
                extra = f"Retry-After: {self.retry_after:g}\r\n" if kind == "429" else ""
                status = {"503": "503 Service Unavailable", "429": "429 Too Many Requests",
                          "400": "400 Bad Request"}[kind]
                await self._reply(writer, status, payload, extra)
                return
            try:
                async with httpx.AsyncClient(timeout=600) as client:
                    resp = await client.request(
                        method, self.upstream + path.removeprefix("/v1"), content=body,
                        headers={"content-type": headers.get("content-type",
                                                             "application/json")},
                    )
            except httpx.HTTPError as exc:  # counted; the connection fails as it did
                with self.lock:
                    self.upstream_failed[type(exc).__name__] += 1
                raise
            if method == "POST":
                with self.lock:
                    if resp.status_code == 200:
                        self.upstream_ok[key] += 1
                    else:
                        self.upstream_failed[resp.status_code] += 1
            extra = "".join(f"{k}: {v}\r\n" for k, v in resp.headers.items()
                            if k.lower() == "retry-after")
            await self._reply(writer, f"{resp.status_code} X", resp.content, extra)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            writer.transport.abort()
        finally:
            self._open.discard(writer)
            if self._stop is not None and self._stop.is_set():  # cancelled by the stop
                writer.transport.abort()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: str, payload: bytes,
                     extra: str = "") -> None:
        writer.write(
            (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(payload)}\r\n{extra}Connection: close\r\n\r\n")
            .encode("latin-1") + payload
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()
            await self._stop.wait()
            server.close()  # first stop accepting, then reset what is open, as a killed
            for writer in list(self._open):  # process's connections are: none is left
                writer.transport.abort()  # waiting for a client's read timeout
            await server.wait_closed()

        asyncio.run(main())

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        """Stop listening (later connections are refused, as from a killed server); idempotent."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
