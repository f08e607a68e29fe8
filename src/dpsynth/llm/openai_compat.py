"""Any OpenAI-compatible server (vLLM, llama.cpp server, Ollama, OpenAI, ``dpsynth llm serve``).

Requests run concurrently in a bounded thread pool over one ``httpx.Client``. Transient
failures (HTTP 429 and 5xx, timeouts, connection errors) are retried with exponential backoff
and full jitter, honouring ``Retry-After``. Each result is handed to ``on_result`` as it
arrives (the request cache stores it at once); when a request still fails after the last
retry, the pending ones are cancelled, the running ones finish, and a
:class:`~dpsynth.llm.base.GenerationError` names the status and how many requests finished.
"""

from __future__ import annotations

import email.utils
import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from .base import (
    FALLBACK_STOPS,
    GenerationError,
    GenerationRequest,
    ResultCallback,
    apply_stops,
    progress_bar,
    render_chat_fallback,
)

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class _RequestFailed(Exception):
    def __init__(self, status: int | None, cause: str, attempts: int) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
        self.attempts = attempts


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform(0, min(cap, base * 2**attempt))."""
    return rng.uniform(0.0, min(cap, base * (2.0**attempt)))


class OpenAIGenerator:
    """Generator over an OpenAI-compatible HTTP API.

    Chat messages go to ``/chat/completions`` when ``chat`` is true; otherwise they are
    rendered with :func:`~dpsynth.llm.base.render_chat_fallback` and sent to ``/completions``.
    Plain-text prompts go to ``/completions``. ``top_k`` is sent only when > 0 (it is an
    extension of vLLM / llama.cpp). The API key is read from the environment variable
    ``api_key_env`` when set (optional for local servers).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        chat: bool = True,
        max_concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 5,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_retry_after: float = 120.0,
        extra_body: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{model}"
        self.supports_chat = bool(chat)
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_after = max_retry_after
        self.extra_body = dict(extra_body or {})
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self.attempts = 0  # HTTP attempts made (for tests and logs)
        self.sleep = time.sleep  # replaceable, e.g. to record backoff delays in tests

    def close(self) -> None:
        self._client.close()

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any], tuple[str, ...]]:
        p = request.params
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "max_tokens": p.max_new_tokens,
            "n": 1,
            "stream": False,
        }
        if p.top_k > 0:
            body["top_k"] = p.top_k
        if p.seed is not None:
            body["seed"] = p.seed
        stops = p.stop
        if isinstance(request.prompt, str):
            path = "/completions"
            body["prompt"] = request.prompt
        elif self.supports_chat:
            path = "/chat/completions"
            body["messages"] = list(request.prompt)
        else:
            path = "/completions"
            body["prompt"] = render_chat_fallback(request.prompt)
            stops = stops + FALLBACK_STOPS
        if stops:
            body["stop"] = list(stops)[:4]  # the OpenAI API takes at most four
        body.update(self.extra_body)
        return path, body, stops

    def _one(self, request: GenerationRequest) -> str:
        path, body, stops = self._body(request)
        attempt = 0
        while True:
            status: int | None = None
            wait_for: float | None = None
            try:
                self.attempts += 1
                resp = self._client.post(path, json=body)
                status = resp.status_code
                if status < 400:
                    return apply_stops(self._parse(resp, path), stops)
                if status not in RETRY_STATUS:
                    raise _RequestFailed(status, f"HTTP {status}", attempt + 1)
                cause = f"HTTP {status}"
                wait_for = parse_retry_after(resp.headers.get("Retry-After"))
            except httpx.TimeoutException:
                cause = "timeout"
            except httpx.TransportError as exc:
                cause = f"connection error ({type(exc).__name__})"
            if attempt >= self.max_retries:
                raise _RequestFailed(status, cause, attempt + 1)
            with self._rng_lock:
                delay = backoff_delay(attempt, self.backoff_base, self.backoff_max, self._rng)
            if wait_for is not None:
                delay = min(max(wait_for, delay), self.max_retry_after)
            self.sleep(delay)
            attempt += 1

    @staticmethod
    def _parse(resp: httpx.Response, path: str) -> str:
        try:
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"] if path == "/chat/completions" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _RequestFailed(resp.status_code, "malformed response body", 1) from exc
        return text or ""

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        """Send all requests (at most ``max_concurrency`` at once); same order out."""
        out: list[str | None] = [None] * len(requests)
        if not requests:
            return []
        failure: _RequestFailed | None = None
        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests)))
        try:
            futures: dict[Future[str], int] = {
                pool.submit(self._one, r): i for i, r in enumerate(requests)
            }
            pending = set(futures)
            with progress_bar(progress, len(requests), f"{self.name} generating") as advance:
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for fut in done:
                        if fut.cancelled():
                            continue
                        exc = fut.exception()
                        if exc is None:
                            i = futures[fut]
                            out[i] = fut.result()
                            if on_result is not None:
                                on_result(i, out[i])  # type: ignore[arg-type]
                            advance()
                        elif failure is None:
                            if not isinstance(exc, _RequestFailed):
                                exc = _RequestFailed(None, type(exc).__name__, 1)
                            failure = exc
                            for other in pending:
                                other.cancel()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            finished = sum(t is not None for t in out)
            raise GenerationError(
                f"{self.name} at {self.base_url}: a request failed after {failure.attempts} "
                f"attempt(s) with {failure.cause}; {finished} of {len(requests)} requests "
                "finished (results already handed to the cache are kept)",
                completed=finished,
                total=len(requests),
                status=failure.status,
            )
        return [t if t is not None else "" for t in out]
