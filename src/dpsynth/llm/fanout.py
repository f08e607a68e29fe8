"""Routing requests across several OpenAI-compatible endpoints (replicas of one model).

:class:`EndpointPool` hands each HTTP attempt of
:class:`~dpsynth.llm.openai_compat.OpenAIGenerator` an endpoint: the least busy of those that
are *up* and have a free slot (at most ``max_concurrency`` requests in flight per endpoint;
ties go round-robin). An endpoint whose attempt fails with a connection error, a timeout or a
retryable status (5xx, 429, ...) is marked *down* for a cool-down (``cooldown_s``, doubling
with each consecutive failure up to ``max_cooldown_s``, at least the server's
``Retry-After``); its requests go to the others meanwhile, and once the cool-down has passed
it gets requests again (the first one is its probe). When every endpoint is down, the
down endpoint that recovers first is used, and the generator's circuit breaker decides how
long to keep trying (its outage is "all endpoints down"). With one endpoint the pool only
bounds concurrency. Which endpoint served a request never enters a cache key, so adding or
removing replicas keeps the request cache valid. Endpoint URLs are public configuration;
nothing here sees more than prompts (docs/methods.md §6).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError


class PoolAborted(Exception):
    """Waiting for an endpoint was given up (the call is failing)."""


@dataclass
class Endpoint:
    """One server: its URL, HTTP client and health. Counters are for run summaries/tests."""

    url: str
    client: Any
    index: int
    in_flight: int = 0
    fails: int = 0  # consecutive failed attempts
    down_until: float = 0.0
    served: int = 0  # successful answers
    failed: int = 0  # failed attempts (all causes that mark it down)
    peak: int = 0  # most requests in flight at once
    causes: dict[str, int] = field(default_factory=dict)


class EndpointPool:
    """Endpoint choice, per-endpoint concurrency bound and health (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        make_client: Callable[[str], Any],
        *,
        max_concurrency: int,
        cooldown_s: float = 5.0,
        max_cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ConfigError("at least one endpoint URL is needed")
        if len(set(urls)) != len(urls):
            raise ConfigError("endpoint URLs must be distinct")
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if not cooldown_s >= 0 or not max_cooldown_s >= cooldown_s:
            raise ConfigError("need 0 <= cooldown_s <= max_cooldown_s")
        self.endpoints = [Endpoint(u, make_client(u), i) for i, u in enumerate(urls)]
        self.max_concurrency = max_concurrency
        self.cooldown_s = float(cooldown_s)
        self.max_cooldown_s = float(max_cooldown_s)
        self.clock = clock
        self._cond = threading.Condition()
        self._turn = 0

    def __len__(self) -> int:
        return len(self.endpoints)

    def _is_up(self, ep: Endpoint, now: float) -> bool:
        return ep.down_until <= now

    def _pick(self, now: float) -> Endpoint | None:
        n = len(self.endpoints)
        up = [e for e in self.endpoints if self._is_up(e, now)]
        if up:
            free = [e for e in up if e.in_flight < self.max_concurrency]
            if not free:
                return None  # wait for a slot on a healthy endpoint
            return min(free, key=lambda e: (e.in_flight, (e.index - self._turn) % n))
        # every endpoint is down: the one that recovers first (the breaker paces the tries)
        free = [e for e in self.endpoints if e.in_flight < self.max_concurrency]
        return min(free, key=lambda e: e.down_until) if free else None

    def acquire(self, abort: threading.Event | None = None) -> tuple[Endpoint, float]:
        """Take a slot on an endpoint; return it and the seconds spent waiting for it.

        Raises :class:`PoolAborted` when ``abort`` is set while waiting.
        """
        start = self.clock()
        with self._cond:
            while True:
                if abort is not None and abort.is_set():
                    raise PoolAborted("given up: another request failed")
                now = self.clock()
                ep = self._pick(now)
                if ep is not None:
                    ep.in_flight += 1
                    ep.peak = max(ep.peak, ep.in_flight)
                    self._turn = (ep.index + 1) % len(self.endpoints)
                    return ep, self.clock() - start
                recover = [e.down_until - now for e in self.endpoints if e.down_until > now]
                self._cond.wait(timeout=max(0.01, min([0.2, *recover])))

    def release(self, ep: Endpoint) -> None:
        with self._cond:
            ep.in_flight -= 1
            self._cond.notify_all()

    def success(self, ep: Endpoint) -> None:
        """``ep`` answered (any non-retryable status): it is up."""
        with self._cond:
            ep.fails = 0
            ep.down_until = 0.0
            ep.served += 1
            self._cond.notify_all()

    def answered(self, ep: Endpoint) -> None:
        """``ep`` answered with a final error (e.g. 400): up, but nothing was served."""
        with self._cond:
            ep.fails = 0
            ep.down_until = 0.0
            self._cond.notify_all()

    def failure(self, ep: Endpoint, cause: str, retry_after: float | None = None) -> bool:
        """Mark ``ep`` down after a failed attempt; return whether another endpoint is up."""
        with self._cond:
            ep.fails += 1
            ep.failed += 1
            ep.causes[cause] = ep.causes.get(cause, 0) + 1
            now = self.clock()
            cool = min(self.cooldown_s * 2 ** min(ep.fails - 1, 30), self.max_cooldown_s)
            if retry_after is not None:
                cool = max(cool, retry_after)
            ep.down_until = max(ep.down_until, now + cool)
            self._cond.notify_all()
            return any(self._is_up(e, now) for e in self.endpoints if e is not ep)

    def counts(self) -> dict[str, dict[str, Any]]:
        """Per endpoint URL: answers served, failed attempts by cause, peak concurrency, up."""
        now = self.clock()
        with self._cond:
            return {e.url: {"served": e.served, "failed": e.failed, "causes": dict(e.causes),
                            "peak_in_flight": e.peak, "up": self._is_up(e, now)}
                    for e in self.endpoints}
