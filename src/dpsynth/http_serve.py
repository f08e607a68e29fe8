"""Running one of dpsynth's HTTP apps (``llm serve``, ``rag serve``) with uvicorn: it says
where it listens once the socket is bound, so a user never waits on a silent terminal."""

from __future__ import annotations

from typing import Any


def server_url(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_app(app: Any, host: str, port: int, *, what: str, path: str = "",
            log_level: str = "warning", key: bool = False) -> None:
    """Serve ``app`` until interrupted; once listening, print ``<what>: ready at URL`` (with
    ``path``, e.g. ``/v1``) and whether requests need the API key."""
    import uvicorn

    url = server_url(host, port) + path
    note = " (requests need the API key)" if key else ""

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"{what}: ready at {url}{note}", flush=True)

    Announcing(uvicorn.Config(app, host=host, port=port, log_level=log_level,
                              access_log=False)).run()


__all__ = ["run_app", "server_url"]
