"""Serving an ASGI app with uvicorn from a background thread: tests, benchmarks, the Env and the CPU demo.

``BackgroundServer`` binds its socket before the thread starts, so its URL is known at once and port 0 picks a free
port with no race for it.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn


class BackgroundServer:
    """An ASGI app served by uvicorn on ``host:port`` from a daemon thread; a context manager."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: Any) -> None:
        """``uvicorn_options`` go to ``uvicorn.Config`` (defaults: warnings only, no websockets)."""
        options = {"log_level": "warning", "ws": "none", "lifespan": "on"} | uvicorn_options
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on such sockets (else ~40 ms delayed-ACK stalls)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.host, self.port = self.socket.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name=f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def _serve(self) -> None:
        self.server.run(sockets=[self.socket])

    def start(self, timeout_s: float = 15.0) -> BackgroundServer:
        """Start serving; return once the app's startup has finished."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} did not start")
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut down gracefully (the app's shutdown runs) and wait for the thread."""
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self.socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
