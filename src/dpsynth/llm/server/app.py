"""The app factory: :func:`create_app` builds the batcher, the error handling and body limit,
and registers each API family's routes; :func:`serve` runs it with uvicorn."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...api_key import require_api_key, server_api_key
from ...http_serve import run_app
from .. import openai_api as api
from ..base import Generator, NamedModel
from .batcher import MicroBatcher
from .chat import add_chat_routes
from .completions import add_completion_routes
from .models import add_model_routes
from .responses import error
from .service import CompletionService


def served_name(generator: Generator, model_id: str | None) -> str:
    """``model_id``, else the generator's model id, else its name without ``backend:``."""
    own = generator.model_id if isinstance(generator, NamedModel) else None
    return model_id or own or generator.name.split(":", 1)[-1]


def add_limits(app: FastAPI, max_body_bytes: int) -> None:
    """HTTP errors in OpenAI's error shape, and 413 for a body over ``max_body_bytes``."""

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
    """The FastAPI app serving ``generator`` (see :mod:`dpsynth.llm.server`).

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
    served = served_name(generator, model_id)
    batcher = MicroBatcher(
        generator,
        max_batch_requests=max_batch_requests,
        max_pending=max_pending,
        batch_window_s=batch_window_s,
        queue_timeout_s=queue_timeout_s,
    )
    service = CompletionService(generator, batcher, served, max_batch, max_pending,
                                queue_timeout_s, retry_after_s, default_max_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        batcher.close()

    app = FastAPI(title="dpsynth OpenAI-compatible server", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)
    app.state.batcher = batcher
    app.state.served_model = served
    add_limits(app, max_body_bytes)
    add_model_routes(app, served)
    add_chat_routes(app, service)
    add_completion_routes(app, service)
    require_api_key(app, api_key, lambda message: api.error_body(
        message, "invalid_request_error", None, "invalid_api_key"))
    return app


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
