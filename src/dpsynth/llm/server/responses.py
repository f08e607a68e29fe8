"""The server's answers in OpenAI's error shape ``{"error": {"message", "type", "param",
"code"}}``, with ``Retry-After`` where the client should come back."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from .. import openai_api as api
from ..base import GenerationError
from .batcher import QueueTimeout


def respond(exc: api.ApiError) -> JSONResponse:
    """The JSON answer of ``exc`` (its status, body and ``Retry-After``)."""
    resp = JSONResponse(status_code=exc.status, content=exc.body())
    if exc.retry_after is not None:
        resp.headers["Retry-After"] = f"{max(1, round(exc.retry_after))}"
    return resp


def error(status: int, message: str, kind: str = "invalid_request_error",
          retry_after: float | None = None, param: str | None = None,
          code: str | None = None) -> JSONResponse:
    """An error answer built from its parts."""
    return respond(api.ApiError(status, message, param=param, code=code, kind=kind,
                                retry_after=retry_after))


def failure(exc: BaseException, retry_after_s: float) -> api.ApiError:
    """The error of a request whose generation failed or never started."""
    if isinstance(exc, QueueTimeout):
        return api.ApiError(503, f"server overloaded: {exc}", kind="server_error",
                            retry_after=retry_after_s)
    if isinstance(exc, GenerationError):
        return api.ApiError(500, str(exc), kind="server_error")
    # never echo prompt text: the type name only
    return api.ApiError(500, f"generation failed ({type(exc).__name__})", kind="server_error")
