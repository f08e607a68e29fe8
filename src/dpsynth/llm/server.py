"""An OpenAI-compatible HTTP server over any :class:`~dpsynth.llm.base.Generator`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (a list of prompts is one request of
several completions), ``GET /v1/models`` and ``GET /v1/models/{model}``. What a request may
hold, and what is refused with 400 naming the parameter rather than ignored, is
:mod:`dpsynth.llm.openai_api`. Every error is the OpenAI body
``{"error": {"message", "type", "param", "code"}}``; bodies over ``max_body_bytes`` get 413.

* **Model name:** the server serves one name (``model_id``, ``--served-model-name``; default
  the generator's model id, e.g. ``smollm2``), listed by ``/v1/models``; a request naming
  another model gets 404 ``model_not_found``.
* **Choices:** ``n`` >= 1 choices per prompt, choice ``k`` sampled with seed ``seed + k``;
  the same seed and prompt give the same text (on a local model whatever the request is
  batched with, see below). ``max_tokens`` >= 1; left out, it is 16 on ``/v1/completions``
  (OpenAI's default) and ``default_max_tokens`` on chat; prompt + ``max_tokens`` over the
  model's context is a 400 (``context_length_exceeded``), and a chat request without
  ``max_tokens`` is given what is left of the context, up to ``default_max_tokens``.
* **finish_reason / usage:** ``"length"`` when ``max_tokens`` cut the text, ``"stop"`` when the
  model ended it (end-of-sequence token or a stop string). ``usage`` counts the prompt the
  model read once per prompt (chat template included) and every generated token (the
  end-of-sequence token included). Both come from the generator's
  :class:`~dpsynth.llm.base.Completion` (local models; ``Generator.complete``); a generator
  with only ``generate`` is counted with its tokenizer's ``encode`` when it has one (an
  estimate, with ``"length"`` when the text has ``max_tokens`` tokens), else zeros.
* **Streaming** (``stream: true``): server-sent events ``data: {chunk}`` ending with
  ``data: [DONE]``, in the chunk shapes the OpenAI client parses (``chat.completion.chunk``
  with a first ``delta`` of role and empty content, then content deltas, then an empty delta
  with ``finish_reason``; ``text_completion`` chunks on ``/v1/completions``;
  ``stream_options.include_usage`` adds a last chunk with ``usage``). On a local model
  (:func:`decode_rows`, token by token) this is real incremental streaming: each token's
  settled text (:mod:`dpsynth.llm.incremental`) is sent as it is decoded, and the chunks add
  up to exactly the text a non-streamed request gets. Any other generator (e.g. an
  OpenAI-compatible upstream) answers at once: one chunk with the whole text, then the final
  chunk. Headers go out once the request's generation has started, so 400/404/429/503 are
  ordinary HTTP answers; an error during generation is an event ``data: {"error": ...}``
  followed by ``[DONE]``.

Micro-batching: requests go to a :class:`MicroBatcher` whose one worker thread takes everything
queued (up to ``max_batch_requests`` completions; requests arriving while the model is busy
wait for the next round, and an idle model waits ``batch_window_s`` for company) and generates
it in one call. The queue is bounded: past ``max_pending`` queued completions a request gets
429 with ``Retry-After``, and one that waited longer than ``queue_timeout_s`` without being
started gets 503 with ``Retry-After``, so a client is always answered. On a local model
(:class:`~dpsynth.llm.local.LocalGenerator`) a batch is decoded by :func:`decode_rows`, which
samples every row from its own seeded random stream, so a request's seed holds whatever it is
batched with. The server sees prompts; run it inside the trusted area when prompts hold
private text (docs/methods.md §6).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api_key import require_api_key, server_api_key
from ..http_serve import run_app
from . import openai_api as api
from .base import (
    Completion,
    GenerationError,
    GenerationRequest,
    Generator,
    SamplingParams,
    apply_stops,
)
from .incremental import IncrementalText

#: Called from the batcher's thread with each newly settled piece of one completion's text.
DeltaSink = Callable[[str], None]


def _filter_logits(logits: Any, params: SamplingParams) -> Any:
    """Temperature, top-k and top-p (nucleus) on a ``[B, V]`` float tensor."""
    import torch

    logits = logits / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, idx = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest set reaching top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, ordered)
    return logits


def decode_rows(gen: Any, requests: Sequence[GenerationRequest],
                deltas: Sequence[DeltaSink | None] | None = None) -> list[Completion]:
    """Decode requests of equal sampling parameters (seeds aside) as one KV-cached batch.

    Row ``i`` samples from ``torch.Generator().manual_seed(seed_i)`` (a random seed when the
    request has none), so its random stream does not depend on the other rows; greedy when
    the temperature is 0. A row ends at an end-of-sequence token or a stop string (finish
    reason ``"stop"``) or after ``max_new_tokens`` (``"length"``). ``deltas[i]``, when given,
    is called with each newly settled piece of row ``i``'s text as it is decoded (streaming).
    Needs the local backend's ``render``, ``encode_prompt``, ``forward_last``, ``decode``,
    ``eos_token_ids``, ``pad_token_id`` and ``max_context``.
    """
    import torch

    params = requests[0].params
    rendered = [gen.render(r) for r in requests]
    rows = [gen.encode_prompt(text) for text, _, _ in rendered]
    for i, r in enumerate(rows):
        if len(r) + params.max_new_tokens > gen.max_context:
            raise GenerationError(f"{gen.name}: request {i} is over the context of "
                                  f"{gen.max_context} tokens", total=len(requests))
    width = max(len(r) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), int(gen.pad_token_id), dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    streams = []
    for r in requests:
        seed = r.params.seed if r.params.seed is not None else random.getrandbits(63)
        streams.append(torch.Generator().manual_seed(int(seed) % (2**63)))
    sinks = list(deltas) if deltas is not None else [None] * b
    trackers = [IncrementalText(stops, is_chat) if sink is not None else None
                for (_, stops, is_chat), sink in zip(rendered, sinks, strict=True)]
    eos = set(int(t) for t in gen.eos_token_ids)
    out: list[list[int]] = [[] for _ in rows]
    done = [False] * b
    try:
        with torch.inference_mode():
            logits, cache = gen.forward_last(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
            )
            for step in range(params.max_new_tokens):
                logits = logits.float()
                if params.temperature > 0:
                    probs = torch.softmax(_filter_logits(logits, params), dim=-1)
                    picks = [int(torch.multinomial(probs[i], 1, generator=streams[i]))
                             for i in range(b)]
                else:
                    picks = [int(t) for t in logits.argmax(-1)]
                for i, t in enumerate(picks):
                    if done[i]:
                        continue
                    out[i].append(t)
                    if t in eos:
                        done[i] = True
                        continue
                    stops, tracker = rendered[i][1], trackers[i]
                    if not stops and tracker is None:
                        continue
                    text = gen.decode(out[i])
                    if stops and any(s in text for s in stops):
                        done[i] = True
                    if tracker is not None:
                        piece = tracker.update(text)
                        if piece:
                            sinks[i](piece)  # type: ignore[misc]
                if all(done) or step == params.max_new_tokens - 1:
                    break
                feed = torch.tensor([[int(gen.pad_token_id) if d else t]
                                     for t, d in zip(picks, done, strict=True)])
                mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
                logits, cache = gen.forward_last(
                    cache, input_ids=feed, attention_mask=mask, position_ids=pos, use_cache=True
                )
    except GenerationError:
        raise
    except Exception as exc:  # a torch error's message holds no prompt text
        raise GenerationError(f"{gen.name}: decoding failed ({type(exc).__name__})") from exc
    completions = []
    for row, prompt, ended, (_, stops, is_chat) in zip(out, rows, done, rendered, strict=True):
        text = apply_stops(gen.decode([t for t in row if t not in eos]), stops)
        completions.append(Completion(text.strip() if is_chat else text,
                                      "stop" if ended else "length", len(prompt), len(row)))
    if hasattr(gen, "generated_tokens"):
        gen.generated_tokens += sum(len(r) for r in out)
    return completions


def estimated_completion(gen: Any, request: GenerationRequest, text: str) -> Completion:
    """A plain text of a generator without ``complete``, counted with its ``encode`` if any.

    An estimate: ``"length"`` when the text has ``max_new_tokens`` tokens by that count.
    """
    encode = getattr(gen, "encode", None)
    if encode is None:
        return Completion(text, "stop")
    prompt = request.prompt if isinstance(request.prompt, str) else "\n".join(
        m["content"] for m in request.prompt)
    n = len(encode(text))
    return Completion(text, "length" if n >= request.params.max_new_tokens else "stop",
                      len(encode(prompt)), n)


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
        self.per_row = all(hasattr(generator, a) for a in ("forward_last", "render"))
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
        if not self.per_row:
            return self._complete(reqs)
        from .batching import plan_batches

        out: list[Completion | None] = [None] * len(reqs)
        for batch in plan_batches(reqs, self.max_batch_requests):
            done = decode_rows(self.generator, [reqs[i] for i in batch],
                               [deltas[i] for i in batch])
            for i, c in zip(batch, done, strict=True):
                out[i] = c
        return [c for c in out if c is not None]

    def _complete(self, reqs: list[GenerationRequest]) -> list[Completion]:
        """A generator without per-row decoding: ``complete`` if it has it, else ``generate``."""
        complete = getattr(self.generator, "complete", None)
        if callable(complete):
            out = list(complete(reqs, progress=False))
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


class _Stream:
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


def create_app(
    generator: Generator,
    *,
    model_id: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_batch: int = 256,
    max_batch_requests: int = 32,
    max_pending: int = 256,
    batch_window_s: float = 0.01,
    queue_timeout_s: float = 60.0,
    retry_after_s: float = 1.0,
    default_max_tokens: int = 512,
    api_key: str | None = None,
) -> FastAPI:
    """The FastAPI app serving ``generator`` (see the module docstring).

    ``api_key``: every request must carry ``Authorization: Bearer api_key`` (401 in OpenAI's
    error shape otherwise; :mod:`dpsynth.api_key`).

    ``model_id`` is the served model name (default: the generator's ``model_id``, else its
    ``name`` without the ``backend:`` prefix). ``max_batch`` bounds the completions of one
    HTTP request; ``max_batch_requests`` those of one generate call (1 = the old
    one-at-a-time server). ``app.state.batcher`` is the :class:`MicroBatcher` (its counters
    are for tests and benchmarks).
    """
    if default_max_tokens < 1:
        raise ValueError("default_max_tokens must be >= 1")
    served = model_id or getattr(generator, "model_id", None) or \
        generator.name.split(":", 1)[-1]
    batcher = MicroBatcher(
        generator,
        max_batch_requests=max_batch_requests,
        max_pending=max_pending,
        batch_window_s=batch_window_s,
        queue_timeout_s=queue_timeout_s,
    )
    counts_prompts = all(hasattr(generator, a) for a in ("render", "encode_prompt",
                                                         "max_context"))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title="dpsynth OpenAI-compatible server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.batcher = batcher
    app.state.served_model = served

    def respond(exc: api.ApiError) -> JSONResponse:
        resp = JSONResponse(status_code=exc.status, content=exc.body())
        if exc.retry_after is not None:
            resp.headers["Retry-After"] = f"{max(1, round(exc.retry_after))}"
        return resp

    def error(status: int, message: str, kind: str = "invalid_request_error",
              retry_after: float | None = None, param: str | None = None,
              code: str | None = None) -> JSONResponse:
        return respond(api.ApiError(status, message, param=param, code=code, kind=kind,
                                    retry_after=retry_after))

    def failure(exc: BaseException) -> api.ApiError:
        """The error of a request whose generation failed or never started."""
        if isinstance(exc, QueueTimeout):
            return api.ApiError(503, f"server overloaded: {exc}", kind="server_error",
                                retry_after=retry_after_s)
        if isinstance(exc, GenerationError):
            return api.ApiError(500, str(exc), kind="server_error")
        # never echo prompt text: the type name only
        return api.ApiError(500, f"generation failed ({type(exc).__name__})",
                            kind="server_error")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return error(exc.status_code, str(exc.detail), kind)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            return error(413, f"request body over {max_body_bytes} bytes")
        if request.method == "POST":
            body = await request.body()
            if len(body) > max_body_bytes:
                return error(413, f"request body over {max_body_bytes} bytes")
        return await call_next(request)

    def model_card() -> dict[str, Any]:
        return {"id": served, "object": "model", "created": 0, "owned_by": "dpsynth"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}", response_model=None)
    def model(model: str) -> Any:
        if model != served:
            return error(404, f"The model '{model}' does not exist: this server serves "
                              f"'{served}'", param="model", code="model_not_found")
        return model_card()

    def prompt_tokens(prompt: Any) -> int | None:
        if not counts_prompts:
            return None
        text, _, _ = generator.render(GenerationRequest(prompt))  # type: ignore[attr-defined]
        return len(generator.encode_prompt(text))  # type: ignore[attr-defined]

    def build(parsed: api.ParsedRequest, chat: bool) -> list[GenerationRequest]:
        """The completions of a checked request: max_tokens per prompt, n choices each."""
        reqs = []
        for prompt in parsed.prompts:
            given = parsed.max_tokens
            wanted = given or (default_max_tokens if chat
                               else api.COMPLETIONS_DEFAULT_MAX_TOKENS)
            length = prompt_tokens(prompt)
            if length is not None:
                context = int(generator.max_context)  # type: ignore[attr-defined]
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

    def usage(parsed: api.ParsedRequest, done: list[Completion],
              reqs: list[GenerationRequest]) -> dict[str, int]:
        """Prompt tokens once per prompt, completion tokens of every choice."""
        firsts = range(0, len(done), parsed.n)
        prompt = sum(_prompt_count(generator, done[i], reqs[i]) for i in firsts)
        completion = sum(_completion_count(generator, c) for c in done)
        return api.usage_body(prompt, completion)

    async def run(reqs: list[GenerationRequest]) -> list[Completion] | JSONResponse:
        if len(reqs) > max_pending:  # could never be queued: not a reason to retry
            return error(400, f"{len(reqs)} completions in one request; at most {max_pending}",
                         param="n")
        try:
            fut = batcher.submit(reqs)
        except QueueFull as exc:
            return error(429, f"server busy: {exc}", "rate_limit_error", retry_after_s)
        waiting = asyncio.wrap_future(fut)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), queue_timeout_s)
            except TimeoutError:
                if fut.cancel():  # still queued: answer now rather than leave it waiting
                    batcher.expired += 1
                    return error(503, f"server overloaded: queued over {queue_timeout_s:g} s",
                                 "server_error", retry_after_s)
                return await waiting  # already generating: its answer is near
        except asyncio.CancelledError:  # the client went away: drop it if still queued
            fut.cancel()
            raise
        except Exception as exc:
            return respond(failure(exc))

    async def open_stream(reqs: list[GenerationRequest]
                          ) -> tuple[Future[list[Completion]], _Stream] | JSONResponse:
        """Queue a streamed request and wait until its generation starts (or fails)."""
        if len(reqs) > max_pending:
            return error(400, f"{len(reqs)} completions in one request; at most {max_pending}",
                         param="n")
        stream = _Stream(asyncio.get_running_loop(), len(reqs))
        try:
            fut = batcher.submit(reqs, on_start=stream.started, deltas=stream.deltas)
        except QueueFull as exc:
            return error(429, f"server busy: {exc}", "rate_limit_error", retry_after_s)
        fut.add_done_callback(stream.finished)
        try:
            try:
                await asyncio.wait_for(stream.ready.wait(), queue_timeout_s)
            except TimeoutError:
                if fut.cancel():
                    batcher.expired += 1
                    return error(503, f"server overloaded: queued over {queue_timeout_s:g} s",
                                 "server_error", retry_after_s)
                await stream.ready.wait()  # it is being started right now
        except asyncio.CancelledError:
            fut.cancel()
            raise
        if fut.done() and fut.exception() is not None:
            return respond(failure(fut.exception()))  # type: ignore[arg-type]
        return fut, stream

    async def events(parsed: api.ParsedRequest, reqs: list[GenerationRequest],
                     fut: Future[list[Completion]], stream: _Stream,
                     maker: api.ChunkMaker) -> AsyncIterator[bytes]:
        sent = [""] * len(reqs)
        if maker.chat:
            for i in range(len(reqs)):
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
            yield api.sse(maker.usage(usage(parsed, done, reqs)))
        yield api.SSE_DONE

    async def answer(request: Request, chat: bool) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "body is not valid JSON")
        try:
            parse = api.parse_chat if chat else api.parse_completions
            parsed = parse(body, served=served, max_choices=max_batch)
            reqs = build(parsed, chat)
        except api.ApiError as exc:
            return respond(exc)
        except (TypeError, ValueError) as exc:  # e.g. a message GenerationRequest refuses
            return error(400, f"bad request: {exc}")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        if parsed.stream:
            opened = await open_stream(reqs)
            if isinstance(opened, JSONResponse):
                return opened
            fut, stream = opened
            maker = api.ChunkMaker(chat, rid, created, served, parsed.include_usage)
            return StreamingResponse(
                events(parsed, reqs, fut, stream, maker), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        done = await run(reqs)
        if isinstance(done, JSONResponse):
            return done
        shape = api.chat_body if chat else api.completions_body
        return shape(rid, created, served, done, usage(parsed, done, reqs))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Any:
        return await answer(request, chat=True)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        return await answer(request, chat=False)

    require_api_key(app, api_key, lambda message: api.error_body(
        message, "invalid_request_error", None, "invalid_api_key"))
    return app


def _prompt_count(gen: Any, done: Completion, req: GenerationRequest) -> int:
    if done.prompt_tokens is not None:
        return done.prompt_tokens
    estimate = estimated_completion(gen, req, "").prompt_tokens
    return estimate or 0


def _completion_count(gen: Any, done: Completion) -> int:
    if done.completion_tokens is not None:
        return done.completion_tokens
    encode = getattr(gen, "encode", None)
    return len(encode(done.text)) if encode is not None else 0


def serve(
    generator: Generator,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_id: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_batch_requests: int = 32,
    max_pending: int = 256,
    queue_timeout_s: float = 60.0,
    default_max_tokens: int = 512,
    log_level: str = "info",
    api_key: str | None = None,
) -> None:
    """Run the server with uvicorn until interrupted (loopback by default; any other host
    needs an API key: :func:`dpsynth.api_key.server_api_key`); it prints its URL once it
    listens."""
    key = server_api_key(host, api_key)
    app = create_app(generator, model_id=model_id, max_body_bytes=max_body_bytes,
                     max_batch_requests=max_batch_requests, max_pending=max_pending,
                     queue_timeout_s=queue_timeout_s, default_max_tokens=default_max_tokens,
                     api_key=key)
    run_app(app, host, port, what="dpsynth llm serve", path="/v1", log_level=log_level,
            key=key is not None)
