"""The connection to the inference backend: forwarding requests and turning transport failures into proxy errors.

Requests go through ``UpstreamPool`` (``upstream.py``), a keep-alive HTTP/1.1 pool made for this one job.

A non-streamed call must be answered within ``request_timeout_s`` in total; a stream must start within it and never
pause longer than it between chunks. Connection failures are ``BackendUnavailableError`` (502), timeouts
``BackendTimeoutError`` (504), a backend 5xx ``BackendError`` (502), a backend 4xx ``BackendRejectedError`` (its own
status and body).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from pydantic_core import from_json

from producers.proxy.exceptions import (
    BackendError,
    BackendRejectedError,
    BackendTimeoutError,
    BackendUnavailableError,
)
from producers.proxy.settings import ProxySettings
from producers.proxy.upstream import UpstreamError, UpstreamPool, UpstreamResponse

EPISODE_HEADER = "X-Orchard-Episode-Id"
"""Sent to the backend with every forwarded request (the scripted backend keys its plan by it)."""


@contextlib.contextmanager
def backend_errors(timeout_s: float) -> Iterator[None]:
    """Translate transport failures and timeouts into proxy errors."""
    try:
        yield
    except TimeoutError as exc:
        raise BackendTimeoutError(f"the backend did not answer within {timeout_s:g}s") from exc
    except UpstreamError as exc:
        raise BackendUnavailableError(f"the backend is unreachable: {exc.args[0] if exc.args else exc}") from exc


def check_status(status: int, content: bytes) -> None:
    """Raise the proxy error for a backend's non-2xx answer."""
    if status < 400:
        return
    try:
        body: Any = from_json(content)
    except ValueError:
        body = None
    if 400 <= status < 500:
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
            text = content[:500].decode(errors="replace")
            body = {"error": {"message": text, "type": "invalid_request_error", "param": None, "code": None}}
        raise BackendRejectedError(status, body)
    detail = body["error"].get("message") if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    raise BackendError(f"the backend failed with {status}: {detail or content[:300].decode(errors='replace')}")


class BackendClient:
    """A keep-alive connection pool to the backend's base URL, with the backend's key and the proxy's limits."""

    def __init__(self, settings: ProxySettings) -> None:
        """Connections are pooled up to ``max_backend_connections``."""
        self.timeout_s = settings.request_timeout_s
        headers = {"content-type": "application/json"}
        if settings.backend_api_key is not None:
            headers["authorization"] = f"Bearer {settings.backend_api_key.get_secret_value()}"
        self.pool = UpstreamPool(
            settings.backend_base_url,
            headers=headers,
            max_connections=settings.max_backend_connections,
            connect_timeout_s=settings.connect_timeout_s,
        )

    async def post(self, path: str, content: bytes, episode_id: str) -> dict[str, Any]:
        """Forward a non-streamed request; the backend's JSON object, or a proxy error."""
        with backend_errors(self.timeout_s):
            async with asyncio.timeout(self.timeout_s):
                response = await self.pool.request("POST", path, content, {EPISODE_HEADER: episode_id})
                try:
                    answer = await response.read()
                finally:
                    await response.aclose()
        check_status(response.status, answer)
        try:
            body = from_json(answer)
        except ValueError as exc:
            raise BackendError(f"the backend answered {response.status} with a body that is not JSON") from exc
        if not isinstance(body, dict):
            raise BackendError("the backend answered with JSON that is not an object")
        return body

    async def open_stream(self, path: str, content: bytes, episode_id: str) -> UpstreamResponse:
        """Forward a streamed request; the open response (read it with ``stream(self.timeout_s)``, then
        ``aclose`` it), or a proxy error."""
        with backend_errors(self.timeout_s):
            async with asyncio.timeout(self.timeout_s):
                response = await self.pool.request("POST", path, content, {EPISODE_HEADER: episode_id})
                if response.status >= 400:
                    try:
                        body = await response.read()
                    finally:
                        await response.aclose()
                    check_status(response.status, body)
        return response

    async def get(self, path: str) -> tuple[int, bytes]:
        """Forward a GET (``/models``): status and body, or a proxy error for failures."""
        with backend_errors(self.timeout_s):
            async with asyncio.timeout(self.timeout_s):
                response = await self.pool.request("GET", path)
                try:
                    body = await response.read()
                finally:
                    await response.aclose()
        check_status(response.status, body)
        return response.status, body

    async def aclose(self) -> None:
        """Close pooled connections."""
        await self.pool.aclose()
