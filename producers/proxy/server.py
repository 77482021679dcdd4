"""Running the proxy (or any ASGI app) with uvicorn: in the foreground for a command, or on a background thread.

``BackgroundServer`` binds its socket before the thread starts, so its URL is known at once and port 0 picks a free
port; tests, benchmarks and the Env use it to run the proxy and the scripted backend in-process.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from orchard.bus import open_bus
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from producers.proxy.app import create_proxy_app
from producers.proxy.settings import ProxySettings

log = get_logger("proxy.server")


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


def serve_proxy(settings: ProxySettings, config: OrchardConfig, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve the recording proxy on ``host:port`` until interrupted, publishing to the bus of ``config``."""
    bus = open_bus(config.bus)
    try:
        log.info("serving recording proxy", host=host, port=port, backend=settings.backend_base_url)
        uvicorn.run(create_proxy_app(settings, bus), host=host, port=port, log_level="warning", ws="none")
    finally:
        bus.close()
