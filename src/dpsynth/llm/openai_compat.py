"""Any OpenAI-compatible server (vLLM, llama.cpp server, Ollama, OpenAI, ``dpsynth llm serve``).

Requests run concurrently in a bounded thread pool over one ``httpx.Client``. Transient
failures (HTTP 408/409/425/429/5xx, timeouts, connection errors) are retried by ``tenacity``
with full-jitter exponential backoff, honouring ``Retry-After``, within a *time budget* per
request (``retry_budget_s``; ``max_attempts`` is an optional extra cap). A
:class:`CircuitBreaker` shared by all requests stops sending after ``breaker_threshold``
consecutive failures, lets one probe through every ``probe_interval_s`` and gives up once the
outage has lasted ``outage_patience_s``; time spent waiting on the breaker is not charged to a
request's budget. Each result is handed to ``on_result`` as it arrives (the request cache
stores it at once); when a request fails for good, the pending ones are cancelled, the running
ones finish, and a :class:`~dpsynth.llm.base.GenerationError` names the cause and how many
requests finished. Retries are counted in ``retries`` and ``retry_causes``. A retry re-sends
a prompt only: privacy noise is drawn elsewhere and never redrawn (docs/methods.md §0); the
server sees prompts, never private records for the PE methods (docs/methods.md §6).

Several endpoints (``base_urls``: replicas of one model behind vLLM, llama.cpp, Ollama or
``dpsynth llm serve``) share the requests through an :class:`~dpsynth.llm.fanout.EndpointPool`:
at most ``max_concurrency`` in flight per endpoint; an endpoint that fails is marked down for a
cool-down and the failed attempt is retried at once on another endpoint that is up (counted in
``retries`` and ``failovers``); the breaker counts only failures while no other endpoint is up,
so its outage means "every endpoint down". The generator's ``name`` (the cache key) is the model
name only, so a resumed run against another set of endpoints pays no call twice.
"""

from __future__ import annotations

import email.utils
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any

import httpx
import tenacity

from ..errors import ConfigError
from .base import (
    FALLBACK_STOPS,
    Completion,
    GenerationError,
    GenerationRequest,
    ResultCallback,
    apply_stops,
    progress_bar,
    render_chat_fallback,
)
from .fanout import Endpoint, EndpointPool, PoolAborted

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class _RequestFailed(Exception):
    """A request that failed for good (not retried further)."""

    def __init__(self, status: int | None, cause: str, attempts: int) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
        self.attempts = attempts


class _Transient(Exception):
    """One failed attempt that may be retried."""

    def __init__(self, status: int | None, cause: str, retry_after: float | None,
                 failover: bool = False) -> None:
        super().__init__(cause)
        self.status = status
        self.cause = cause
        self.retry_after = retry_after
        self.failover = failover  # another endpoint is up: retry there without waiting


class OutageError(Exception):
    """The circuit breaker stayed open longer than its patience."""


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


class CircuitBreaker:
    """Closed until ``threshold`` consecutive failures; then open: callers of
    :meth:`before_attempt` wait, one probe goes through every ``probe_interval_s``; a success
    closes it, and an outage longer than ``patience_s`` makes every caller raise
    :class:`OutageError` (for good: the breaker stays tripped)."""

    def __init__(
        self,
        threshold: int = 8,
        patience_s: float = 300.0,
        probe_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"breaker threshold must be >= 1, got {threshold}")
        self.threshold = threshold
        self.patience_s = patience_s
        self.probe_interval_s = probe_interval_s
        self.clock = clock
        self._cond = threading.Condition()
        self._failures = 0
        self._opened_at: float | None = None
        self._next_probe = 0.0
        self._probing = False
        self.tripped = False
        self.openings = 0  # how many times it opened

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def before_attempt(self, abort: threading.Event | None = None) -> float:
        """Block while open (unless this caller is the probe); return the seconds waited.

        A set ``abort`` event ends the wait with :class:`OutageError` (the call was given up).
        """
        start = self.clock()
        with self._cond:
            while True:
                if abort is not None and abort.is_set():
                    raise OutageError("given up: another request failed")
                if self.tripped:
                    raise OutageError(self._outage_message())
                if self._opened_at is None:
                    return self.clock() - start
                now = self.clock()
                if now - self._opened_at > self.patience_s:
                    self.tripped = True
                    self._cond.notify_all()
                    raise OutageError(self._outage_message())
                if not self._probing and now >= self._next_probe:
                    self._probing = True
                    return self.clock() - start
                until = min(self._next_probe, self._opened_at + self.patience_s) - now
                if abort is not None:
                    until = min(until, 0.2)
                self._cond.wait(timeout=max(0.01, until))

    def _outage_message(self) -> str:
        return (f"server unavailable for over {self.patience_s:g} s (outage_patience_s) after "
                f"{self.threshold} consecutive failures")

    def success(self) -> None:
        with self._cond:
            self._failures = 0
            self._probing = False
            if self._opened_at is not None:
                self._opened_at = None
                self._cond.notify_all()

    def failure(self) -> None:
        with self._cond:
            self._failures += 1
            now = self.clock()
            if self._opened_at is None:
                if self._failures >= self.threshold:
                    self._opened_at = now
                    self._next_probe = now + self.probe_interval_s
                    self.openings += 1
            else:  # the probe failed (or a request sent before the breaker opened)
                self._probing = False
                self._next_probe = now + self.probe_interval_s
            self._cond.notify_all()


class _Wait(tenacity.wait.wait_base):
    """Full-jitter exponential backoff, at least the server's ``Retry-After`` (capped)."""

    def __init__(self, base: float, cap: float, max_retry_after: float) -> None:
        self.jitter = tenacity.wait_random_exponential(multiplier=base, max=cap)
        self.max_retry_after = max_retry_after

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        delay = float(self.jitter(retry_state))
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if getattr(exc, "failover", False):
            return 0.0
        after = getattr(exc, "retry_after", None)
        if after is not None:
            delay = min(max(float(after), delay), self.max_retry_after)
        return delay


class OpenAIGenerator:
    """Generator over an OpenAI-compatible HTTP API.

    Chat messages go to ``/chat/completions`` when ``chat`` is true; otherwise they are
    rendered with :func:`~dpsynth.llm.base.render_chat_fallback` and sent to ``/completions``.
    Plain-text prompts go to ``/completions``. ``top_k`` is sent only when > 0 (it is an
    extension of vLLM / llama.cpp). The API key is read from the environment variable
    ``api_key_env`` when set (optional for local servers). ``timeout`` is per attempt (and
    never longer than what is left of the request's ``retry_budget_s``). ``base_url`` may be
    a list of endpoints (or pass ``base_urls``); ``max_concurrency`` is per endpoint and
    ``endpoint_cooldown_s`` how long a failed endpoint is first left alone.
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | None,
        model: str,
        *,
        base_urls: Sequence[str] | None = None,
        endpoint_cooldown_s: float = 5.0,
        api_key_env: str | None = "OPENAI_API_KEY",
        chat: bool = True,
        max_concurrency: int = 8,
        timeout: float = 120.0,
        retry_budget_s: float = 600.0,
        max_attempts: int | None = None,
        outage_patience_s: float = 300.0,
        breaker_threshold: int = 8,
        probe_interval_s: float = 2.0,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        max_retry_after: float = 120.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not timeout > 0 or not retry_budget_s > 0:
            raise ValueError("timeout and retry_budget_s must be > 0")
        urls = _endpoint_urls(base_url, base_urls)
        self.base_urls = urls
        self.base_url = urls[0]
        self.model = model
        self.name = f"openai:{model}"  # the cache key: never the endpoint(s)
        self.supports_chat = bool(chat)
        self.max_concurrency = max_concurrency
        self.timeout = float(timeout)
        self.retry_budget_s = float(retry_budget_s)
        self.max_attempts = max_attempts
        self.extra_body = dict(extra_body or {})
        self.breaker = CircuitBreaker(breaker_threshold, outage_patience_s, probe_interval_s)
        self._wait = _Wait(backoff_base, backoff_max, max_retry_after)
        self._count_lock = threading.Lock()
        self.pool = _endpoint_pool(urls, api_key_env, timeout, max_concurrency,
                                   endpoint_cooldown_s)
        self.attempts = 0  # HTTP attempts made
        self.retries = 0  # attempts that were retried after a transient failure
        self.failovers = 0  # retries sent at once to another endpoint that was up
        self.retry_causes: Counter[str] = Counter()  # e.g. {"HTTP 503": 3, "timeout": 1}
        # how retries wait; None = on the call's abort event (a failed call stops waiting)
        self.sleep: Callable[[float], None] | None = None

    def close(self) -> None:
        for ep in self.pool.endpoints:
            ep.client.close()

    def retry_counts(self) -> dict[str, int]:
        """HTTP counters for a run summary: attempts, retries, failovers, breaker openings."""
        return {"http_attempts": self.attempts, "http_retries": self.retries,
                "http_failovers": self.failovers, "breaker_openings": self.breaker.openings,
                "endpoints": len(self.pool)}

    def endpoint_counts(self) -> dict[str, dict[str, Any]]:
        """Per endpoint URL: answers served, failed attempts (by cause), peak in flight, up."""
        return self.pool.counts()

    def _failed(self, ep: Endpoint, cause: str, retry_after: float | None = None) -> bool:
        """Record a failed attempt on ``ep``; return whether to fail over to another one."""
        others_up = self.pool.failure(ep, cause, retry_after)
        if not others_up or self.breaker.is_open:
            self.breaker.failure()  # the outage the breaker waits out: every endpoint down
        return others_up

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

    def _one(self, request: GenerationRequest, abort: threading.Event) -> Completion:
        """One request: attempts under the breaker, retried by tenacity within the budget;
        given up (not retried further) once ``abort`` is set."""
        path, body, stops = self._body(request)
        paused = 0.0  # seconds spent waiting on the breaker: not charged to the budget
        attempts = 0
        start = time.monotonic()

        def attempt() -> Completion:
            nonlocal paused, attempts
            if abort.is_set():
                raise _RequestFailed(None, "given up: another request failed", attempts)
            paused += self.breaker.before_attempt(abort)
            try:
                ep, waited = self.pool.acquire(abort)
            except PoolAborted as exc:
                raise _RequestFailed(None, str(exc), attempts) from None
            paused += waited  # queueing for a free endpoint is not charged either
            try:
                attempts += 1
                with self._count_lock:
                    self.attempts += 1
                left = self.retry_budget_s - (time.monotonic() - start - paused)
                t = max(1.0, min(self.timeout, left))
                return self._post(ep, path, body, stops, t, attempts)
            finally:
                self.pool.release(ep)

        def stop(rs: tenacity.RetryCallState) -> bool:
            if abort.is_set():
                return True
            if self.max_attempts is not None and rs.attempt_number >= self.max_attempts:
                return True
            used = time.monotonic() - start - paused
            return used + rs.upcoming_sleep >= self.retry_budget_s

        def count(rs: tenacity.RetryCallState) -> None:
            exc = rs.outcome.exception() if rs.outcome else None
            with self._count_lock:
                self.retries += 1
                self.failovers += bool(getattr(exc, "failover", False))
                self.retry_causes[getattr(exc, "cause", "error")] += 1

        retrying = tenacity.Retrying(
            stop=stop,
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(_Transient),
            sleep=lambda s: self.sleep(s) if self.sleep is not None else abort.wait(s),
            before_sleep=count,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient as exc:
            raise _RequestFailed(exc.status, exc.cause, attempts) from None

    def _post(self, ep: Endpoint, path: str, body: dict[str, Any], stops: tuple[str, ...],
              t: float, attempts: int) -> Completion:
        """One HTTP attempt on ``ep`` within ``t`` seconds: its completion (stops applied), a
        ``_Transient`` failure (retried) or a ``_RequestFailed`` one (not)."""
        try:
            resp = ep.client.post(
                path, json=body, timeout=httpx.Timeout(t, connect=min(t, 10.0))
            )
        except httpx.TimeoutException:
            over = self._failed(ep, "timeout")
            raise _Transient(None, "timeout", None, over) from None
        except httpx.TransportError as exc:
            cause = f"connection error ({type(exc).__name__})"
            over = self._failed(ep, cause)
            raise _Transient(None, cause, None, over) from None
        status = resp.status_code
        if status in RETRY_STATUS:
            after = parse_retry_after(resp.headers.get("Retry-After"))
            over = self._failed(ep, f"HTTP {status}", after)
            raise _Transient(status, f"HTTP {status}", after, over)
        self.breaker.success()  # any non-transient answer: the server is up
        if status >= 400:
            self.pool.answered(ep)
            raise _RequestFailed(status, f"HTTP {status}", attempts)
        done = self._parse(resp, path, attempts)
        self.pool.success(ep)
        text = apply_stops(done.text, stops)
        if text == done.text:
            return done
        return Completion(text, "stop", done.prompt_tokens, done.completion_tokens)

    @staticmethod
    def _parse(resp: httpx.Response, path: str, attempts: int = 1) -> Completion:
        """The first choice's text, its finish reason (``"length"`` only when the server said
        so) and the ``usage`` token counts when the server sent them."""
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if path == "/chat/completions" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise _RequestFailed(resp.status_code, "malformed response body", attempts) from exc
        usage = data.get("usage") if isinstance(data, dict) else None
        usage = usage if isinstance(usage, dict) else {}

        def count(key: str) -> int | None:
            value = usage.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return Completion(text or "", reason, count("prompt_tokens"), count("completion_tokens"))

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        """Send all requests (at most ``max_concurrency`` at once per endpoint); same order
        out."""
        return [c.text for c in self.complete(requests, progress=progress, on_result=on_result)]

    def complete(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[Completion]:
        """:meth:`generate` with each answer's finish reason and ``usage`` token counts."""
        out: list[Completion | None] = [None] * len(requests)
        if not requests:
            return []
        failure: _RequestFailed | None = None
        abort = threading.Event()
        workers = min(self.max_concurrency * len(self.pool), len(requests))
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            futures: dict[Future[Completion], int] = {
                pool.submit(self._one, r, abort): i for i, r in enumerate(requests)
            }
            with progress_bar(progress, len(requests),
                              f"{self.name} generating (texts)") as advance:
                # one by one as they finish, so the cache stores each answer at once
                for fut in as_completed(futures):
                    if fut.cancelled():
                        continue
                    exc = fut.exception()
                    if exc is None:
                        i = futures[fut]
                        done = fut.result()
                        out[i] = done
                        if on_result is not None:
                            on_result(i, done.text)
                        advance()
                    elif failure is None:
                        if isinstance(exc, OutageError):
                            exc = _RequestFailed(None, str(exc), 0)
                        elif not isinstance(exc, _RequestFailed):
                            exc = _RequestFailed(None, type(exc).__name__, 1)
                        failure = exc
                        abort.set()  # running requests finish their attempt, no retries
                        for other in futures:
                            other.cancel()
        finally:
            abort.set()
            pool.shutdown(wait=True, cancel_futures=True)
        if failure is not None:
            finished = sum(t is not None for t in out)
            how = (f"a request failed after {failure.attempts} attempt(s) with {failure.cause}"
                   if failure.attempts else failure.cause)
            where = (self.base_url if len(self.base_urls) == 1
                     else f"{len(self.base_urls)} endpoints ({', '.join(self.base_urls)})")
            raise GenerationError(
                f"{self.name} at {where}: {how}; {finished} of {len(requests)} requests "
                "finished (results already handed to the cache are kept)",
                completed=finished,
                total=len(requests),
                status=failure.status,
            )
        return [c if c is not None else Completion("", "stop") for c in out]


def _endpoint_pool(urls: list[str], api_key_env: str | None, timeout: float,
                   max_concurrency: int, cooldown_s: float) -> EndpointPool:
    """An HTTP client per endpoint (the key of ``$api_key_env`` as a bearer token, when set)
    in a pool of up to ``max_concurrency`` requests each."""
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def make_client(url: str) -> httpx.Client:
        return httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=max_concurrency),
        )

    return EndpointPool(urls, make_client, max_concurrency=max_concurrency,
                        cooldown_s=cooldown_s, max_cooldown_s=max(60.0, cooldown_s))


def _endpoint_urls(base_url: str | Sequence[str] | None,
                   base_urls: Sequence[str] | None) -> list[str]:
    """The endpoint list from ``base_url`` (a URL or a list) or ``base_urls`` (not both)."""
    if base_url is not None and base_urls is not None:
        raise ConfigError("give base_url or base_urls, not both")
    given = base_urls if base_urls is not None else base_url
    if given is None:
        raise ConfigError("an OpenAI-compatible generator needs base_url or base_urls")
    raw = [given] if isinstance(given, str) else list(given)
    if not raw or not all(isinstance(u, str) and u.strip() for u in raw):
        raise ConfigError("base_urls must be a non-empty list of URLs")
    urls = [u.strip().rstrip("/") for u in raw]
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ConfigError(f"endpoint URL {u!r} must start with http:// or https://")
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise ConfigError(f"base_urls lists an endpoint twice: {dup}")
    return urls
