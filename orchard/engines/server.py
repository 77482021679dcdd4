"""Running an engine's app in a background thread (tests, benchmarks, the CPU demo); ``orchard engine serve`` runs
it in the foreground through ``orchard.engines.config.serve_engine``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI

from orchard.http_server import BackgroundServer

STARTUP_TIMEOUT_S = 60.0


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on ``host:port`` (0: a free port) in a daemon thread; yield the base URL until exit (which
    stops the server, and so the app's lifespan: the engine's worker and reloader)."""
    server = BackgroundServer(app, host, port).start(timeout_s=STARTUP_TIMEOUT_S)
    try:
        yield server.url
    finally:
        server.stop(STARTUP_TIMEOUT_S)
