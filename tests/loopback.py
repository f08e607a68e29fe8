"""Test helper: serve an ASGI app with uvicorn in a background thread on a free 127.0.0.1
port, for the tests that talk to our own servers over real HTTP on loopback (and never to any
other address)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from dpsynth.errors import ComputeError, require


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(app: Any, path: str = "", start_timeout_s: float = 60.0) -> Iterator[str]:
    """Run ``app`` until the block ends; yields ``http://127.0.0.1:PORT`` + ``path``."""
    uvicorn = require("uvicorn", "serve", "serving on loopback")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise ComputeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}{path}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
