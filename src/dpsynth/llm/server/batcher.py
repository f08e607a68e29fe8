"""The batching worker: a bounded queue and one thread that generates queued requests together.

It takes everything queued (up to ``max_batch_requests`` completions; requests arriving while
the model is busy wait for the next round, and an idle model waits ``batch_window_s`` for
company). Past ``max_pending`` queued completions :meth:`MicroBatcher.submit` raises
:class:`QueueFull`; a request queued longer than ``queue_timeout_s`` fails with
:class:`QueueTimeout`. A :class:`~dpsynth.llm.base.RowDecoder` is decoded by
:func:`~dpsynth.llm.server.decode.decode_rows`, any other generator by ``complete`` or
``generate``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from ..base import (
    Completer,
    Completion,
    GenerationError,
    GenerationRequest,
    Generator,
    RowDecoder,
)
from ..batching import plan_batches
from .decode import DeltaSink, decode_rows
from .usage import estimated_completion


class QueueFull(Exception):
    """The batcher's queue is full (answered with 429)."""


class QueueTimeout(Exception):
    """A request waited in the queue past ``queue_timeout_s`` (answered with 503)."""


@dataclass
class _Pending:
    """One HTTP request's completions in the queue."""

    reqs: list[GenerationRequest]
    fut: Future[list[Completion]]
    queued_at: float
    on_start: Callable[[], None] | None
    deltas: list[DeltaSink | None] | None


class MicroBatcher:
    """A bounded queue and one worker thread that generates queued requests together."""

    def __init__(
        self,
        generator: Generator,
        *,
        max_batch_requests: int = 32,
        max_pending: int = 256,
        batch_window_s: float = 0.01,
        queue_timeout_s: float = 60.0,
    ) -> None:
        if max_batch_requests < 1 or max_pending < 1:
            raise ValueError("max_batch_requests and max_pending must be >= 1")
        self.generator = generator
        self.max_batch_requests = max_batch_requests
        self.max_pending = max_pending
        self.batch_window_s = batch_window_s
        self.queue_timeout_s = queue_timeout_s
        # checked once: a RowDecoder is decoded by decode_rows, row by row
        self.row_decoder = generator if isinstance(generator, RowDecoder) else None
        self.per_row = self.row_decoder is not None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._stop = False
        # generate calls made and completions they served (the bench's mean batch); two
        # counters, so a long-lived server keeps constant memory
        self.generate_calls = 0
        self.completions = 0
        self.rejected = 0
        self.expired = 0
        self._thread = threading.Thread(target=self._work, name="dpsynth-batcher", daemon=True)
        self._thread.start()

    def submit(self, reqs: list[GenerationRequest], *,
               on_start: Callable[[], None] | None = None,
               deltas: list[DeltaSink | None] | None = None) -> Future[list[Completion]]:
        """Queue one HTTP request's completions; raise :class:`QueueFull` when over the bound.

        ``on_start`` is called (from the worker thread) when their generation starts, and
        ``deltas[i]`` with the settled text pieces of completion ``i`` where the generator
        decodes token by token (:func:`decode_rows`).
        """
        fut: Future[list[Completion]] = Future()
        with self._cond:
            if self._stop:
                raise QueueFull("server is shutting down")
            if self._pending + len(reqs) > self.max_pending:
                self.rejected += 1
                raise QueueFull(f"{self._pending} completions queued (max_pending)")
            self._pending += len(reqs)
            self._queue.append(_Pending(reqs, fut, time.monotonic(), on_start, deltas))
            self._cond.notify()
        return fut

    def close(self) -> None:
        with self._cond:
            self._stop = True
            while self._queue:
                item = self._queue.popleft()
                self._pending -= len(item.reqs)
                if item.fut.set_running_or_notify_cancel():
                    item.fut.set_exception(QueueTimeout("server is shutting down"))
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _take(self) -> list[_Pending]:
        with self._cond:
            while not self._queue and not self._stop:
                self._cond.wait()
            if self._stop:
                return []
            deadline = time.monotonic() + self.batch_window_s  # an idle model waits briefly
            while self._pending < self.max_batch_requests and not self._stop:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            items: list[_Pending] = []
            count = 0
            now = time.monotonic()
            while self._queue:
                item = self._queue[0]
                if items and count + len(item.reqs) > self.max_batch_requests:
                    break
                self._queue.popleft()
                self._pending -= len(item.reqs)
                if not item.fut.set_running_or_notify_cancel():  # the handler gave up waiting
                    continue
                if now - item.queued_at > self.queue_timeout_s:
                    self.expired += 1
                    item.fut.set_exception(QueueTimeout(
                        f"queued over {self.queue_timeout_s:g} s"))
                    continue
                items.append(item)
                count += len(item.reqs)
        for item in items:
            if item.on_start is not None:
                item.on_start()
        return items

    def _generate(self, reqs: list[GenerationRequest],
                  deltas: list[DeltaSink | None]) -> list[Completion]:
        if self.row_decoder is None:
            return self._complete(reqs)
        out: list[Completion | None] = [None] * len(reqs)
        for batch in plan_batches(reqs, self.max_batch_requests):
            done = decode_rows(self.row_decoder, [reqs[i] for i in batch],
                               [deltas[i] for i in batch])
            for i, c in zip(batch, done, strict=True):
                out[i] = c
        return [c for c in out if c is not None]

    def _complete(self, reqs: list[GenerationRequest]) -> list[Completion]:
        """A generator without per-row decoding: ``complete`` if it has it, else ``generate``."""
        if isinstance(self.generator, Completer):
            out = list(self.generator.complete(reqs, progress=False))
            if len(out) != len(reqs) or not all(isinstance(c, Completion) for c in out):
                raise GenerationError(f"{self.generator.name}: complete() returned "
                                      f"{len(out)} results for {len(reqs)} requests")
            return out
        texts = list(self.generator.generate(reqs, progress=False))
        if len(texts) != len(reqs):
            raise GenerationError(f"{self.generator.name}: generate() returned {len(texts)} "
                                  f"texts for {len(reqs)} requests")
        return [estimated_completion(self.generator, r, t)
                for r, t in zip(reqs, texts, strict=True)]

    def _work(self) -> None:
        while True:
            items = self._take()
            if not items:
                if self._stop:
                    return
                continue
            reqs = [r for it in items for r in it.reqs]
            deltas = [d for it in items for d in (it.deltas or [None] * len(it.reqs))]
            self.generate_calls += 1
            self.completions += len(reqs)
            try:
                done = self._generate(reqs, deltas)
            except Exception as exc:  # answered as a 500 naming only the error type
                for it in items:
                    it.fut.set_exception(exc)
                continue
            k = 0
            for it in items:
                it.fut.set_result(done[k : k + len(it.reqs)])
                k += len(it.reqs)
