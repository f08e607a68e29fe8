"""`dpsynth rag serve --kb RUN_DIR`: a small JSON API over a synthetic knowledge base.

Routes: ``GET /health`` and ``POST /ask`` ({"question": "...", "k": 3}). The app is built from
an answerer over the run's ``release/`` folder only: no route, file or object in it can reach
the private area, and responses carry only released synthetic passages, the public privacy
statement and generated answers (docs/methods.md §4, §6). Loopback by default; request bodies
over ``max_body_bytes`` get 413 (checked on the Content-Length header and again while the body
streams in), questions over ``max_question_chars`` or blank (empty or whitespace only) get 422.
A budget-limited answerer (the query-time DP-RAG baseline) that refuses a query gets 429.

Back-pressure: one model answers one question at a time; at most ``max_pending`` questions
are admitted (answering or waiting), the next gets 503 with ``Retry-After`` at once, and an
admitted one that waits over ``queue_timeout`` seconds for the model gets 503 too (as does one
whose client has gone away), so no request waits unanswered and no work is done for nobody.
At start-up the knowledge base's index dimension must match the embedder's
(:func:`check_dimensions`), else the service refuses to start.
"""


import json
import logging
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..api_key import require_api_key, server_api_key
from ..embed.protocols import TextEmbedder
from ..errors import ConfigError, require
from ..http_serve import run_app
from ..progress import step

log = logging.getLogger("dpsynth.rag")

MAX_BODY_BYTES = 4096
MAX_QUESTION_CHARS = 1000
MAX_K = 10
MAX_PENDING = 8
QUEUE_TIMEOUT = 30.0
RETRY_AFTER_S = 2


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    k: int | None = Field(None, ge=0, le=MAX_K)  # None: the build's synrag.retrieve

    @field_validator("question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("question is blank (empty or whitespace only)")
        return v


def require_serving() -> None:
    """Raise MissingExtraError unless the ``rag`` extra (fastapi, uvicorn) is installed."""
    for module in ("fastapi", "uvicorn"):
        require(module, "rag", "`dpsynth rag serve`")


class _Busy(Exception):
    """The model did not become free in time (or the client left): answer 503."""


class _Gate:
    """Back-pressure: at most ``max_pending`` questions admitted (answering or waiting), and
    one model answering one question at a time, each waiting at most ``queue_timeout`` s;
    ``from_thread``: ``anyio.from_thread`` (to ask the event loop whether the client left)."""

    def __init__(self, answerer: Any, max_pending: int, queue_timeout: float,
                 from_thread: Any) -> None:
        self.answerer, self.max_pending, self.queue_timeout = answerer, max_pending, queue_timeout
        self.from_thread = from_thread
        self.model_lock = threading.Lock()  # one model, one request at a time
        self.count_lock = threading.Lock()
        self.pending = 0

    def admit(self) -> bool:
        with self.count_lock:
            if self.pending >= self.max_pending:
                return False
            self.pending += 1
            return True

    def leave(self) -> None:
        with self.count_lock:
            self.pending -= 1

    def ask(self, question: str, k: int | None, request: Any) -> dict[str, Any]:
        if not self.model_lock.acquire(timeout=self.queue_timeout):
            raise _Busy(f"no answer slot within {self.queue_timeout:g} s")
        try:
            try:
                gone = self.from_thread.run(request.is_disconnected)
            except Exception:  # noqa: BLE001 - no way to tell: answer anyway
                gone = False
            if gone:
                raise _Busy("client disconnected")
            return self.answerer.ask(question, k)
        finally:
            self.model_lock.release()


async def _read_question(request: Any, max_body_bytes: int) -> AskRequest:
    """The request's body as an :class:`AskRequest`: 413 over ``max_body_bytes`` (declared or
    streamed), 422 when it is not valid JSON or not a valid question."""
    from fastapi import HTTPException

    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
        raise HTTPException(413, f"request body over {max_body_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_body_bytes:
            raise HTTPException(413, f"request body over {max_body_bytes} bytes")
    try:
        return AskRequest.model_validate(json.loads(body or b"null"))
    except (ValueError, ValidationError) as err:
        msg = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                        for e in err.errors()) if isinstance(err, ValidationError) else (
            "body is not valid JSON")
        raise HTTPException(422, msg) from None


def create_app(answerer: Any, info: dict[str, Any] | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES, max_pending: int = MAX_PENDING,
               queue_timeout: float = QUEUE_TIMEOUT, retry_after: int = RETRY_AFTER_S,
               api_key: str | None = None) -> Any:
    """The FastAPI app; ``answerer.ask(question, k) -> dict``; with ``api_key`` every
    request must carry ``Authorization: Bearer api_key`` (:mod:`dpsynth.api_key`)."""
    require("fastapi", "rag", "`dpsynth rag serve`")
    import anyio.from_thread
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool

    from ..privacy import BudgetExceededError, BudgetRefusedError

    if max_pending < 1 or queue_timeout <= 0:
        raise ConfigError("max_pending must be >= 1 and queue_timeout > 0")
    app = FastAPI(title="dpsynth rag", docs_url=None, redoc_url=None, openapi_url=None)
    gate = _Gate(answerer, max_pending, queue_timeout, anyio.from_thread)
    public = dict(info or {})
    busy_headers = {"Retry-After": str(int(retry_after))}

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **public}

    @app.post("/ask")
    async def ask(request: Request) -> dict[str, Any]:
        req = await _read_question(request, max_body_bytes)
        if not gate.admit():
            raise HTTPException(503, f"busy: {max_pending} questions pending; retry later",
                                headers=busy_headers)
        try:
            return await run_in_threadpool(gate.ask, req.question, req.k, request)
        except _Busy as err:
            raise HTTPException(503, f"busy: {err}; retry later", headers=busy_headers) from None
        except (BudgetExceededError, BudgetRefusedError):
            raise HTTPException(429, "privacy budget spent: no more queries") from None
        finally:
            gate.leave()

    require_api_key(app, api_key, lambda message: {"detail": message})
    return app


def embedder_dim(embedder: Any) -> int:
    """The embedder's output dimension (its ``dim``, else one embedding of a fixed text)."""
    dim = embedder.dim if isinstance(embedder, TextEmbedder) else None
    if dim is None:
        import numpy as np

        dim = np.asarray(embedder.embed(["dimension check"])).shape[1]
    return int(dim)


def check_dimensions(kb: Any, embedder: Any, where: Any = "the knowledge base") -> None:
    """Refuse (ConfigError) a KB whose faiss index dimension differs from its embedder's:
    every question would fail. Checked once, at start-up."""
    if kb is None or embedder is None:
        return
    index_dim = int(kb.index.d)
    meta_dim = (kb.meta or {}).get("dim")
    if meta_dim is not None and int(meta_dim) != index_dim:
        raise ConfigError(f"{where}: index.json says dimension {meta_dim} but kb.faiss has "
                          f"{index_dim}; rebuild the index")
    got = embedder_dim(embedder)
    if got != index_dim:
        raise ConfigError(
            f"{where}: the index has dimension {index_dim} but the embedder gives {got} "
            f"(the KB was built with embedder {kb.embedder_name!r}); serve it with that "
            "embedder or rebuild the KB")


def kb_app(kb_dir: Any, *, generator: Any = None, embedder: Any = None,
           max_body_bytes: int = MAX_BODY_BYTES, max_pending: int = MAX_PENDING,
           queue_timeout: float = QUEUE_TIMEOUT, api_key: str | None = None) -> Any:
    """The app over a built KB (reads only its release/ folder). Raises ConfigError, before
    any generator is loaded, when the index dimension does not match the embedder."""
    from .answer import open_answerer, privacy_of, release_dir
    from .index import KnowledgeBase

    rel = release_dir(kb_dir)
    kb = KnowledgeBase.open(rel)
    if embedder is None:
        from ..embed import Embedder

        with step(f"loading embedder {kb.embedder_name}"):
            embedder = Embedder(kb.embedder_name)
    check_dimensions(kb, embedder, rel)
    answerer = open_answerer(kb_dir, generator=generator, embedder=embedder)
    priv = privacy_of(kb_dir)
    info = {"passages": len(answerer.kb) if answerer.kb else 0,
            "epsilon": priv.get("epsilon"), "delta": priv.get("delta"),
            "method": priv.get("method")}
    return create_app(answerer, info, max_body_bytes=max_body_bytes, max_pending=max_pending,
                      queue_timeout=queue_timeout, api_key=api_key)


def serve(kb_dir: Any, host: str = "127.0.0.1", port: int = 8000, *, app: Any = None,
          max_pending: int = MAX_PENDING, queue_timeout: float = QUEUE_TIMEOUT,
          api_key: str | None = None) -> None:
    """Run the API with uvicorn (blocking); ``app`` defaults to :func:`kb_app` of ``kb_dir``
    (an ``app`` given must have been built with the key); any host but loopback needs an API
    key (:func:`dpsynth.api_key.server_api_key`)."""
    require("uvicorn", "rag", "`dpsynth rag serve`")
    key = server_api_key(host, api_key)
    if app is None:
        app = kb_app(kb_dir, max_pending=max_pending, queue_timeout=queue_timeout, api_key=key)
    run_app(app, host, port, what="dpsynth rag serve", key=key is not None)
