"""An OpenAI-compatible HTTP server over any :class:`~dpsynth.llm.base.Generator`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (a list of prompts is one request of
several completions), ``GET /v1/models``. Non-streaming only; ``n`` > 1 is served as n
completions with seeds ``seed, seed+1, ...``. Bodies over ``max_body_bytes`` get 413.

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
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .base import GenerationError, GenerationRequest, Generator, SamplingParams, apply_stops


def _params(body: dict[str, Any], seed_offset: int = 0) -> SamplingParams:
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 64
    seed = body.get("seed")
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    return SamplingParams(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=int(body.get("top_k") or 0),
        max_new_tokens=int(max_tokens),
        stop=tuple(stop),
        seed=None if seed is None else int(seed) + seed_offset,
    )


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


def decode_rows(gen: Any, requests: Sequence[GenerationRequest]) -> list[str]:
    """Decode requests of equal sampling parameters (seeds aside) as one KV-cached batch.

    Row ``i`` samples from ``torch.Generator().manual_seed(seed_i)`` (a random seed when the
    request has none), so its random stream does not depend on the other rows; greedy when
    the temperature is 0. Needs the local backend's ``render``, ``encode_prompt``,
    ``forward_last``, ``decode``, ``eos_token_ids``, ``pad_token_id`` and ``max_context``.
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
    eos = set(int(t) for t in gen.eos_token_ids)
    out: list[list[int]] = [[] for _ in rows]
    done = [False] * b
    try:
        with torch.inference_mode():
            logits, cache = gen.forward_last(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
            )
            for _ in range(params.max_new_tokens):
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
                    stops = rendered[i][1]
                    if t in eos or (stops and any(s in gen.decode(out[i]) for s in stops)):
                        done[i] = True
                if all(done):
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
    texts = []
    for row, (_, stops, is_chat) in zip(out, rendered, strict=True):
        text = apply_stops(gen.decode([t for t in row if t not in eos]), stops)
        texts.append(text.strip() if is_chat else text)
    if hasattr(gen, "generated_tokens"):
        gen.generated_tokens += sum(len(r) for r in out)
    return texts


class QueueFull(Exception):
    """The batcher's queue is full (answered with 429)."""


class QueueTimeout(Exception):
    """A request waited in the queue past ``queue_timeout_s`` (answered with 503)."""


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
        self._per_row = all(hasattr(generator, a) for a in ("forward_last", "render"))
        self._queue: collections.deque[tuple[list[GenerationRequest], Future[list[str]], float]]
        self._queue = collections.deque()
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

    def submit(self, reqs: list[GenerationRequest]) -> Future[list[str]]:
        """Queue one HTTP request's completions; raise :class:`QueueFull` when over the bound."""
        fut: Future[list[str]] = Future()
        with self._cond:
            if self._stop:
                raise QueueFull("server is shutting down")
            if self._pending + len(reqs) > self.max_pending:
                self.rejected += 1
                raise QueueFull(f"{self._pending} completions queued (max_pending)")
            self._pending += len(reqs)
            self._queue.append((reqs, fut, time.monotonic()))
            self._cond.notify()
        return fut

    def close(self) -> None:
        with self._cond:
            self._stop = True
            while self._queue:
                reqs, fut, _ = self._queue.popleft()
                self._pending -= len(reqs)
                fut.set_exception(QueueTimeout("server is shutting down"))
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _take(self) -> list[tuple[list[GenerationRequest], Future[list[str]], float]]:
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
            items = []
            count = 0
            now = time.monotonic()
            while self._queue:
                reqs, fut, t0 = self._queue[0]
                if items and count + len(reqs) > self.max_batch_requests:
                    break
                self._queue.popleft()
                self._pending -= len(reqs)
                if not fut.set_running_or_notify_cancel():  # the handler gave up waiting
                    continue
                if now - t0 > self.queue_timeout_s:
                    self.expired += 1
                    fut.set_exception(QueueTimeout(f"queued over {self.queue_timeout_s:g} s"))
                    continue
                items.append((reqs, fut, t0))
                count += len(reqs)
            return items

    def _generate(self, reqs: list[GenerationRequest]) -> list[str]:
        if not self._per_row:
            return list(self.generator.generate(reqs, progress=False))
        from .local import plan_batches

        out: list[str] = [""] * len(reqs)
        for batch in plan_batches(reqs, self.max_batch_requests):
            texts = decode_rows(self.generator, [reqs[i] for i in batch])
            for i, t in zip(batch, texts, strict=True):
                out[i] = t
        return out

    def _work(self) -> None:
        while True:
            items = self._take()
            if not items:
                if self._stop:
                    return
                continue
            reqs = [r for it in items for r in it[0]]
            self.generate_calls += 1
            self.completions += len(reqs)
            try:
                texts = self._generate(reqs)
            except Exception as exc:  # answered as a 500 naming only the error type
                for _, fut, _ in items:
                    fut.set_exception(exc)
                continue
            k = 0
            for item_reqs, fut, _ in items:
                fut.set_result(texts[k : k + len(item_reqs)])
                k += len(item_reqs)


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
) -> FastAPI:
    """The FastAPI app serving ``generator`` (see the module docstring).

    ``max_batch`` bounds the completions of one HTTP request; ``max_batch_requests`` those of
    one generate call (1 = the old one-at-a-time server). ``app.state.batcher`` is the
    :class:`MicroBatcher` (its counters are for tests and benchmarks).
    """

    served = model_id or generator.name
    batcher = MicroBatcher(
        generator,
        max_batch_requests=max_batch_requests,
        max_pending=max_pending,
        batch_window_s=batch_window_s,
        queue_timeout_s=queue_timeout_s,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title="dpsynth OpenAI-compatible server", docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.batcher = batcher

    def error(status: int, message: str, kind: str = "invalid_request_error",
              retry_after: float | None = None) -> JSONResponse:
        resp = JSONResponse(
            status_code=status, content={"error": {"message": message, "type": kind}}
        )
        if retry_after is not None:
            resp.headers["Retry-After"] = f"{max(1, round(retry_after))}"
        return resp

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

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": served, "object": "model", "created": 0, "owned_by": "dpsynth"}],
        }

    async def run(reqs: list[GenerationRequest]) -> list[str] | JSONResponse:
        if len(reqs) > max_pending:  # could never be queued: not a reason to retry
            return error(400, f"{len(reqs)} completions in one request; at most {max_pending}")
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
        except QueueTimeout as exc:
            return error(503, f"server overloaded: {exc}", "server_error", retry_after_s)
        except GenerationError as exc:
            return error(500, str(exc), "server_error")
        except Exception as exc:  # never echo prompt text: the type name only
            return error(500, f"generation failed ({type(exc).__name__})", "server_error")

    async def read_json(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return error(400, "body must be a JSON object")
        if body.get("stream"):
            return error(400, "stream=true is not supported")
        return body

    def usage(prompts: list[str], texts: list[str]) -> dict[str, int]:
        """Token counts when the generator can tokenise (local backends), else zeros."""
        encode = getattr(generator, "encode", None)
        if encode is None:
            return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        p = sum(len(encode(t)) for t in prompts)
        c = sum(len(encode(t)) for t in texts)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Any:
        body = await read_json(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            n = int(body.get("n") or 1)
            if not 1 <= n <= max_batch:
                return error(400, f"n must be in [1, {max_batch}]")
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return error(400, "'messages' must be a non-empty list")
            reqs = [GenerationRequest(tuple(messages), _params(body, k)) for k in range(n)]
        except (TypeError, ValueError) as exc:
            return error(400, f"bad request: {exc}")
        texts = await run(reqs)
        if isinstance(texts, JSONResponse):
            return texts
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served,
            "choices": [
                {
                    "index": k,
                    "message": {"role": "assistant", "content": t},
                    "finish_reason": "stop",
                }
                for k, t in enumerate(texts)
            ],
            "usage": usage([str(m.get("content", "")) for m in messages], texts),
        }

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Any:
        body = await read_json(request)
        if isinstance(body, JSONResponse):
            return body
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            return error(400, "'prompt' must be a string or a list of strings")
        try:
            n = int(body.get("n") or 1)
            if not prompts or not 1 <= n * len(prompts) <= max_batch:
                return error(400, f"between 1 and {max_batch} completions per request")
            reqs = [GenerationRequest(p, _params(body, k)) for p in prompts for k in range(n)]
        except (TypeError, ValueError) as exc:
            return error(400, f"bad request: {exc}")
        texts = await run(reqs)
        if isinstance(texts, JSONResponse):
            return texts
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": served,
            "choices": [
                {"index": k, "text": t, "finish_reason": "stop", "logprobs": None}
                for k, t in enumerate(texts)
            ],
            "usage": usage([p for p in prompts for _ in range(n)], texts),
        }

    return app


def serve(
    generator: Generator,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_body_bytes: int = 1_000_000,
    max_batch_requests: int = 32,
    max_pending: int = 256,
    queue_timeout_s: float = 60.0,
    log_level: str = "info",
) -> None:
    """Run the server with uvicorn until interrupted (loopback by default)."""
    import uvicorn

    app = create_app(generator, max_body_bytes=max_body_bytes,
                     max_batch_requests=max_batch_requests, max_pending=max_pending,
                     queue_timeout_s=queue_timeout_s)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
