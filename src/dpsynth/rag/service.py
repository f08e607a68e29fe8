"""`dpsynth rag serve --kb RUN_DIR`: a small JSON API over a synthetic knowledge base.

Routes: ``GET /health`` and ``POST /ask`` ({"question": "...", "k": 3}). The app is built from
an answerer over the run's ``release/`` folder only: no route, file or object in it can reach
the private area. Loopback by default; request bodies over ``max_body_bytes`` get 413 (checked
on the Content-Length header and again while the body streams in), questions over
``max_question_chars`` get 422. A budget-limited answerer (the query-time DP-RAG baseline)
that refuses a query gets 429.
"""


import ipaddress
import json
import logging
import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("dpsynth.rag")

MAX_BODY_BYTES = 4096
MAX_QUESTION_CHARS = 1000
MAX_K = 10


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    k: int = Field(3, ge=0, le=MAX_K)


def create_app(answerer: Any, info: dict[str, Any] | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES) -> Any:
    """The FastAPI app; ``answerer.ask(question, k) -> dict``."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.concurrency import run_in_threadpool

    from ..privacy import BudgetExceededError, BudgetRefusedError

    app = FastAPI(title="dpsynth rag", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()
    public = dict(info or {})

    def _ask(question: str, k: int) -> dict[str, Any]:
        with lock:  # one model, one request at a time
            return answerer.ask(question, k)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **public}

    @app.post("/ask")
    async def ask(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
            raise HTTPException(413, f"request body over {max_body_bytes} bytes")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise HTTPException(413, f"request body over {max_body_bytes} bytes")
        try:
            req = AskRequest.model_validate(json.loads(body or b"null"))
        except (ValueError, ValidationError) as err:
            msg = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                            for e in err.errors()) if isinstance(err, ValidationError) else (
                "body is not valid JSON")
            raise HTTPException(422, msg) from None
        try:
            return await run_in_threadpool(_ask, req.question, req.k)
        except (BudgetExceededError, BudgetRefusedError):
            raise HTTPException(429, "privacy budget spent: no more queries") from None

    return app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def kb_app(kb_dir: Any, *, generator: Any = None, embedder: Any = None,
           max_body_bytes: int = MAX_BODY_BYTES) -> Any:
    """The app over a built KB (reads only its release/ folder)."""
    from .answer import open_answerer, privacy_of

    answerer = open_answerer(kb_dir, generator=generator, embedder=embedder)
    priv = privacy_of(kb_dir)
    info = {"passages": len(answerer.kb) if answerer.kb else 0,
            "epsilon": priv.get("epsilon"), "delta": priv.get("delta"),
            "method": priv.get("method")}
    return create_app(answerer, info, max_body_bytes=max_body_bytes)


def serve(kb_dir: Any, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Run the API with uvicorn (blocking)."""
    import uvicorn

    if not is_loopback(host):
        log.warning("serving on %s: reachable from other machines", host)
    uvicorn.run(kb_app(kb_dir), host=host, port=port, log_level="warning")
