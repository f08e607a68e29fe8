"""Test helper: serve an ASGI app with uvicorn in a background thread on a free 127.0.0.1
port, for the tests that talk to our own servers over real HTTP on loopback (and never to any
other address). The server is the one `dpsynth bench serving` runs its clients against."""

from __future__ import annotations

from dpsynth.bench.serving import free_port, serve_on_loopback

serve_in_thread = serve_on_loopback

__all__ = ["free_port", "serve_in_thread"]
