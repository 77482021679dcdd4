"""Running the proxy with uvicorn in the foreground (``orchard proxy serve``); ``BackgroundServer`` (re-exported
from ``orchard.http_server``) runs it, or any ASGI app, on a background thread."""

from __future__ import annotations

import uvicorn

from orchard.bus import open_bus
from orchard.config import OrchardConfig
from orchard.http_server import BackgroundServer
from orchard.logging import get_logger
from orchard.store import open_store
from producers.proxy.app import create_proxy_app
from producers.proxy.settings import ProxySettings

log = get_logger("proxy.server")
__all__ = ["BackgroundServer", "serve_proxy"]


def serve_proxy(settings: ProxySettings, config: OrchardConfig, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Serve the recording proxy on ``host:port`` until interrupted, publishing to the bus of ``config``."""
    bus = open_bus(config.bus)
    store = open_store(config.store)  # screenshots and other inline images are kept there, by digest
    try:
        log.info("serving recording proxy", host=host, port=port, backend=settings.backend_base_url)
        app = create_proxy_app(settings, bus, store)
        uvicorn.run(app, host=host, port=port, log_level="warning", ws="none")
    finally:
        store.close()
        bus.close()
