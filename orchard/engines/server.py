"""Running an engine's app under uvicorn: in the foreground (``orchard engine serve``) or in a background thread.

``serve_in_thread`` is for in-process use (tests, benchmarks, the CPU demo): it binds a free port on loopback
before starting, so there is no race for the port, and stops the server (and so the app's lifespan: the engine's
worker and reloader) on exit.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from fastapi import FastAPI

STARTUP_TIMEOUT_S = 60.0


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on ``host:port`` (0: a free port) in a daemon thread; yield the base URL until exit."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets (otherwise ~40 ms delayed-ACK stalls)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws="none", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="orchard-engine-http", daemon=True)
    thread.start()
    try:
        _wait_started(server, thread)
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(STARTUP_TIMEOUT_S)
        sock.close()


def _wait_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the engine server stopped during startup (see its log)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engine server did not start within {STARTUP_TIMEOUT_S} s")
        time.sleep(0.02)
