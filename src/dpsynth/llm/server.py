"""An OpenAI-compatible HTTP server over any :class:`~dpsynth.llm.base.Generator`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (a list of prompts is generated as one
batch), ``GET /v1/models``. Non-streaming only; ``n`` > 1 is served as n requests with seeds
``seed, seed+1, ...``. Requests run one at a time (the generator batches inside a request).
Bodies over ``max_body_bytes`` get 413. ``fail_first_n`` (tests only) answers the first n
generation requests with ``fail_status`` (and ``Retry-After`` when ``retry_after`` is set);
``fail_after`` (tests only) fails every generation request after the first ``fail_after``.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .base import GenerationError, GenerationRequest, Generator, SamplingParams


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


def create_app(
    generator: Generator,
    *,
    model_id: str | None = None,
    max_body_bytes: int = 1_000_000,
    max_batch: int = 256,
    fail_first_n: int = 0,
    fail_after: int | None = None,
    fail_status: int = 503,
    retry_after: float | None = None,
) -> FastAPI:
    """The FastAPI app serving ``generator`` (see the module docstring)."""

    served = model_id or generator.name
    app = FastAPI(title="dpsynth OpenAI-compatible server", docs_url=None, redoc_url=None)
    lock = threading.Lock()
    state = {"failures_left": fail_first_n, "requests": 0}
    app.state.counters = state

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse(
            status_code=status, content={"error": {"message": message, "type": kind}}
        )

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

    def injected_failure() -> JSONResponse | None:
        with lock:
            state["requests"] += 1
            late = fail_after is not None and state["requests"] > fail_after
            if state["failures_left"] > 0 or late:
                state["failures_left"] = max(0, state["failures_left"] - 1)
                resp = error(fail_status, "injected failure", "server_error")
                if retry_after is not None:
                    resp.headers["Retry-After"] = str(retry_after)
                return resp
        return None

    def run(reqs: list[GenerationRequest]) -> list[str] | JSONResponse:
        with lock:
            try:
                return generator.generate(reqs, progress=False)
            except GenerationError as exc:
                return error(500, str(exc), "server_error")

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
        fail = injected_failure()
        if fail is not None:
            return fail
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
        texts = await _in_thread(run, reqs)
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
        fail = injected_failure()
        if fail is not None:
            return fail
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
        texts = await _in_thread(run, reqs)
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


async def _in_thread(fn: Any, *args: Any) -> Any:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def serve(
    generator: Generator,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_body_bytes: int = 1_000_000,
    log_level: str = "info",
) -> None:
    """Run the server with uvicorn until interrupted (loopback by default)."""
    import uvicorn

    app = create_app(generator, max_body_bytes=max_body_bytes)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
