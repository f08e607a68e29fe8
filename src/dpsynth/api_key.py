"""The API key of dpsynth's HTTP servers (``dpsynth llm serve``, ``dpsynth rag serve``).

Secure by default: a server binds loopback, where no key is needed (only this machine reaches
it). Any other address needs a key (``--api-key KEY`` or ``$DPSYNTH_API_KEY``), and is refused
without one before any model loads. With a key, every request must carry
``Authorization: Bearer KEY``, the header the official ``openai`` client sends for its
``api_key``; any other request gets 401 and nothing else.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import ConfigError

#: the environment variable a server reads its key from when ``--api-key`` is not given
API_KEY_ENV = "DPSYNTH_API_KEY"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_api_key(host: str, given: str | None) -> str | None:
    """The key a server on ``host`` requires: ``given``, else ``$DPSYNTH_API_KEY``, else None
    on loopback; a ConfigError for any other address without a key."""
    key = given or os.environ.get(API_KEY_ENV) or None
    if key is not None and not key.strip():
        raise ConfigError("--api-key: the key is empty")
    if key is None and not is_loopback(host):
        raise ConfigError(
            f"--host {host} makes the server reachable from other machines, so it needs an "
            f"API key: pass --api-key KEY (or set {API_KEY_ENV}); every request must then "
            "send 'Authorization: Bearer KEY' (the openai client's api_key). Without one, "
            "serve on 127.0.0.1")
    return key


def authorised(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer <key>`` (compared in constant
    time)."""
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(),
                                                              key.encode())


def require_api_key(app: Any, key: str | None, body: Callable[[str], dict[str, Any]]) -> None:
    """With ``key``, answer every request of the FastAPI ``app`` that lacks it with 401 and
    ``body(message)`` (each API family's own error shape); without a key, nothing."""
    if key is None:
        return
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable[[Request], Awaitable[Any]]
                        ) -> Any:
        if not authorised(request.headers.get("authorization"), key):
            return JSONResponse(body("missing or wrong API key: send 'Authorization: Bearer "
                                     "KEY'"), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)


__all__ = ["API_KEY_ENV", "authorised", "is_loopback", "require_api_key", "server_api_key"]
