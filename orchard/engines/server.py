"""Serving an engine: in the foreground until interrupted (``serve_engine``, what ``orchard engine serve|scripted``
run), or its app in a background thread (``serve_in_thread``: tests, benchmarks, the CPU demo)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import uvicorn
from fastapi import FastAPI

from orchard.engines.base import Engine
from orchard.engines.config import AnyEngineConfig, EngineConfig
from orchard.engines.factory import open_engine
from orchard.engines.reload import PolicyReloader, open_reloader
from orchard.exceptions import ConfigError
from orchard.http_server import BackgroundServer
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.config import OrchardConfig

STARTUP_TIMEOUT_S = 60.0

log = get_logger("engines")
SHUTDOWN_GRACE_S = 3.0  # a stop's wait for requests in flight before they fail


def serve_engine(config: AnyEngineConfig, orchard_config: OrchardConfig | None = None) -> None:
    """Serve the engine ``config`` names over the OpenAI API until interrupted (blocking); with
    ``policy_updates.enabled``, follow the policy versions of ``orchard_config``'s bus and store."""
    engine = open_engine(config)
    try:
        app = engine.create_app(reloader=_reloader(engine, config, orchard_config))
        vllm_url = getattr(getattr(engine, "client", None), "base_url", None)  # the vLLM server behind it, if any
        log.info("engine serving", type=config.type, host=config.host, port=config.port, model=engine.model_name,
                 vllm=str(vllm_url) if vllm_url is not None else None)  # fmt: skip
        # a stop waits this long for requests in flight, then fails them: a supervisor's grace (10 s) must suffice,
        # and generations of thousands of tokens would otherwise hold the exit until they end (measured: 92 and 118 s)
        uvicorn.run(app, host=config.host, port=config.port, log_level="warning", ws="none",
                    timeout_graceful_shutdown=SHUTDOWN_GRACE_S)  # fmt: skip
    finally:
        engine.close()


def _reloader(engine: Engine, config: AnyEngineConfig, orchard_config: OrchardConfig | None) -> PolicyReloader | None:
    if not isinstance(config, EngineConfig) or not config.policy_updates.enabled:
        return None
    if orchard_config is None:
        raise ConfigError("policy_updates.enabled needs the Orchard config (its bus and store)")
    return open_reloader(engine, config.policy_updates, orchard_config)


@contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``app`` on ``host:port`` (0: a free port) in a daemon thread; yield the base URL until exit (which
    stops the server, and so the app's lifespan: the engine's worker and reloader)."""
    server = BackgroundServer(app, host, port).start(timeout_s=STARTUP_TIMEOUT_S)
    try:
        yield server.url
    finally:
        server.stop(STARTUP_TIMEOUT_S)
