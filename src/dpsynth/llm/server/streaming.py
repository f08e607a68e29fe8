"""Streamed answers: the events of one request handed from the batcher's thread to the
event loop, and the server-sent events made of them (``data: {chunk}`` ... ``[DONE]``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from .. import openai_api as api
from ..base import Completion
from .decode import DeltaSink


class Stream:
    """The events of one streamed request, handed from the batcher's thread to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, choices: int) -> None:
        self._loop = loop
        self.queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()
        self.ready = asyncio.Event()  # generation started, or the request failed first
        self.deltas: list[DeltaSink | None] = [self._sink(i) for i in range(choices)]

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is listening
            self._loop.call_soon_threadsafe(fn, *args)

    def _sink(self, index: int) -> DeltaSink:
        return lambda text: self._call(self.queue.put_nowait, (index, text))

    def started(self) -> None:
        self._call(self.ready.set)

    def finished(self, _: Future[list[Completion]]) -> None:
        self._call(self.queue.put_nowait, None)
        self._call(self.ready.set)


async def events(fut: Future[list[Completion]], stream: Stream, maker: api.ChunkMaker,
                 choices: int, usage: Callable[[list[Completion]], dict[str, int]],
                 failure: Callable[[BaseException], api.ApiError]) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed request of ``choices`` completions: text deltas as
    they settle, what was held back, each choice's finish, ``usage`` when asked, ``[DONE]``;
    an error during generation is an event ``failure(exc).body()`` before ``[DONE]``."""
    sent = [""] * choices
    if maker.chat:
        for i in range(choices):
            yield api.sse(maker.role(i))
    while (item := await stream.queue.get()) is not None:
        i, piece = item
        sent[i] += piece
        yield api.sse(maker.text(i, piece))
    exc = fut.exception()
    if exc is not None:
        yield api.sse(failure(exc).body())
        yield api.SSE_DONE
        return
    done = fut.result()
    for i, c in enumerate(done):  # what was held back, or the whole text (no deltas)
        rest = c.text[len(sent[i]):] if c.text.startswith(sent[i]) else ""
        if rest:
            yield api.sse(maker.text(i, rest))
    for i, c in enumerate(done):
        yield api.sse(maker.finish(i, c.finish_reason))
    if maker.include_usage:
        yield api.sse(maker.usage(usage(done)))
    yield api.SSE_DONE
