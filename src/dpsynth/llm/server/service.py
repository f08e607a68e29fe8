"""What the two generation families (``/v1/completions``, ``/v1/chat/completions``) share:
a checked request becomes completions (``n`` choices per prompt, ``max_tokens`` fitted to the
context), queued on the batcher, answered whole or streamed."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from .. import openai_api as api
from ..base import Completion, GenerationRequest, Generator, PromptTokens
from .batcher import MicroBatcher, QueueFull
from .responses import error, failure, respond
from .streaming import Stream, events
from .usage import completion_count, prompt_count


async def hung_up(request: Request) -> None:
    """Return once the client of ``request`` has closed its connection: its body is read, so
    the next ASGI message is the disconnect. (Waited for, not polled: Starlette's
    ``is_disconnected`` peeks in a cancelled scope, which the body-limit middleware's receive
    does not answer.)"""
    try:
        while (await request.receive()).get("type") != "http.disconnect":
            pass
    except Exception:  # nothing more to receive from this server: never report a hang-up
        await asyncio.Future()


@dataclass
class CompletionService:
    """Answers completion and chat requests for one generator behind one batcher."""

    generator: Generator
    batcher: MicroBatcher
    served: str
    max_batch: int
    max_pending: int
    queue_timeout_s: float
    retry_after_s: float
    default_max_tokens: int

    def __post_init__(self) -> None:
        # checked once: a generator that counts prompt tokens gets max_tokens fitted
        self.counter = self.generator if isinstance(self.generator, PromptTokens) else None

    def failure(self, exc: BaseException) -> api.ApiError:
        """The error of a request whose generation failed or never started."""
        return failure(exc, self.retry_after_s)

    def prompt_tokens(self, prompt: Any) -> int | None:
        """Tokens of ``prompt`` as the model reads it, or None when the generator cannot say."""
        if self.counter is None:
            return None
        text, _, _ = self.counter.render(GenerationRequest(prompt))
        return len(self.counter.encode_prompt(text))

    def build(self, parsed: api.ParsedRequest, chat: bool) -> list[GenerationRequest]:
        """The completions of a checked request: max_tokens per prompt, n choices each."""
        reqs = []
        for prompt in parsed.prompts:
            given = parsed.max_tokens
            wanted = given or (self.default_max_tokens if chat
                               else api.COMPLETIONS_DEFAULT_MAX_TOKENS)
            length = self.prompt_tokens(prompt)
            if length is not None and self.counter is not None:
                context = int(self.counter.max_context)
                if given is None and chat:
                    wanted = min(wanted, context - length)
                if wanted < 1 or length + wanted > context:
                    where = "messages" if chat else "prompt"
                    raise api.ApiError(
                        400, f"This model's maximum context length is {context} tokens; "
                             f"the {where} has {length} and {wanted} more were requested",
                        param="max_tokens" if given else where,
                        code="context_length_exceeded")
            reqs += [GenerationRequest(prompt, parsed.params(wanted, k))
                     for k in range(parsed.n)]
        return reqs

    def usage(self, parsed: api.ParsedRequest, done: list[Completion],
              reqs: list[GenerationRequest]) -> dict[str, int]:
        """Prompt tokens once per prompt, completion tokens of every choice."""
        firsts = range(0, len(done), parsed.n)
        prompt = sum(prompt_count(self.generator, done[i], reqs[i]) for i in firsts)
        completion = sum(completion_count(self.generator, c) for c in done)
        return api.usage_body(prompt, completion)

    def _refused(self, reqs: list[GenerationRequest]) -> JSONResponse | None:
        if len(reqs) > self.max_pending:  # could never be queued: not a reason to retry
            return error(400, f"{len(reqs)} completions in one request; at most "
                              f"{self.max_pending}", param="n")
        return None

    def _busy(self, exc: QueueFull) -> JSONResponse:
        return error(429, f"server busy: {exc}", "rate_limit_error", self.retry_after_s)

    def _expired(self) -> JSONResponse:
        self.batcher.expired += 1
        return error(503, f"server overloaded: queued over {self.queue_timeout_s:g} s",
                     "server_error", self.retry_after_s)

    async def run(self, reqs: list[GenerationRequest], request: Request | None = None
                  ) -> list[Completion] | JSONResponse:
        """Queue the completions and wait for them (or answer why not). A client that hangs
        up while its request is still queued (``request`` tells) has it dropped from the
        queue: a client that timed out and sent the request again would otherwise have the
        model compute both, and a slow server fall further behind with each retry."""
        refused = self._refused(reqs)
        if refused is not None:
            return refused
        try:
            fut = self.batcher.submit(reqs)
        except QueueFull as exc:
            return self._busy(exc)
        waiting = asyncio.wrap_future(fut)
        watch = asyncio.ensure_future(hung_up(request)) if request is not None else None
        try:
            try:
                return await self._wait(fut, waiting, watch)
            except TimeoutError:
                if fut.cancel():  # still queued: answer now rather than leave it waiting
                    return self._expired()
                return await waiting  # already generating: its answer is near
        except asyncio.CancelledError:  # the client went away: drop it if still queued
            fut.cancel()
            raise
        except Exception as exc:
            return respond(self.failure(exc))
        finally:
            if watch is not None:
                watch.cancel()

    async def _wait(self, fut: Future[list[Completion]], waiting: asyncio.Future[Any],
                    watch: asyncio.Future[None] | None) -> list[Completion] | JSONResponse:
        """The completions, or TimeoutError past ``queue_timeout_s``; a hang-up (``watch``
        done first) cancels them if still queued and answers 499 (nobody reads it)."""
        shielded = asyncio.shield(waiting)
        if watch is None:
            return await asyncio.wait_for(shielded, self.queue_timeout_s)
        done, _ = await asyncio.wait({shielded, watch}, timeout=self.queue_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if shielded in done:
            return shielded.result()
        if watch in done and fut.cancel():
            return error(499, "client closed the request", "invalid_request_error")
        shielded.cancel()
        if watch in done:  # already generating: finish it (the cache of a retry may want it)
            return await waiting
        raise TimeoutError

    async def open_stream(self, reqs: list[GenerationRequest]
                          ) -> tuple[Future[list[Completion]], Stream] | JSONResponse:
        """Queue a streamed request and wait until its generation starts (or fails)."""
        refused = self._refused(reqs)
        if refused is not None:
            return refused
        stream = Stream(asyncio.get_running_loop(), len(reqs))
        try:
            fut = self.batcher.submit(reqs, on_start=stream.started, deltas=stream.deltas)
        except QueueFull as exc:
            return self._busy(exc)
        fut.add_done_callback(stream.finished)
        try:
            try:
                await asyncio.wait_for(stream.ready.wait(), self.queue_timeout_s)
            except TimeoutError:
                if fut.cancel():
                    return self._expired()
                await stream.ready.wait()  # it is being started right now
        except asyncio.CancelledError:
            fut.cancel()
            raise
        if fut.done() and fut.exception() is not None:
            return respond(self.failure(fut.exception()))  # type: ignore[arg-type]
        return fut, stream

    async def answer(self, request: Request, chat: bool) -> Any:
        """The answer to one POST of either family (``chat`` for chat completions)."""
        try:
            body = await request.json()
        except ValueError:
            return error(400, "body is not valid JSON")
        try:
            parse = api.parse_chat if chat else api.parse_completions
            parsed = parse(body, served=self.served, max_choices=self.max_batch)
            reqs = self.build(parsed, chat)
        except api.ApiError as exc:
            return respond(exc)
        except (TypeError, ValueError) as exc:  # e.g. a message GenerationRequest refuses
            return error(400, f"bad request: {exc}")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if parsed.stream:
            return await self._streamed(parsed, reqs, api.ChunkMaker(
                chat, rid, created, self.served, parsed.include_usage))
        done = await self.run(reqs, request)
        if isinstance(done, JSONResponse):
            return done
        shape = api.chat_body if chat else api.completions_body
        return shape(rid, created, self.served, done, self.usage(parsed, done, reqs))

    async def _streamed(self, parsed: api.ParsedRequest, reqs: list[GenerationRequest],
                        maker: api.ChunkMaker) -> Any:
        opened = await self.open_stream(reqs)
        if isinstance(opened, JSONResponse):
            return opened
        fut, stream = opened
        return StreamingResponse(
            events(fut, stream, maker, len(reqs),
                   lambda done: self.usage(parsed, done, reqs), self.failure),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
