"""The recording proxy: an OpenAI-compatible server between harnesses and the inference backend that records every
model call token-exactly as a ``ModelCall`` on the bus (prefix-delta encoded, grouped into conversations)."""

from producers.proxy.app import create_proxy_app
from producers.proxy.server import BackgroundServer, serve_proxy
from producers.proxy.settings import ProxySettings

__all__ = ["BackgroundServer", "ProxySettings", "create_proxy_app", "serve_proxy"]
