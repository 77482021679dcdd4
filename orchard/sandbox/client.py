"""Python SDK for the sandbox REST API: ``SandboxClient`` (sync, httpx) and ``AsyncSandboxClient`` (asyncio).

Both return the models of ``orchard.sandbox`` and raise the errors of ``orchard.sandbox.exceptions`` the server
raised (by the error body's code). A ``RemoteSandbox`` is a ``Sandbox``, so code written against the runtime
interface runs unchanged against a remote service::

    with SandboxClient("http://127.0.0.1:8000", token) as client:
        sandbox = client.create(SandboxSpec(sandbox_id="ep-1", run_id="r", episode_id="ep-1", task_id="t"))
        print(sandbox.exec(["pytest", "-q"], timeout_s=600).exit_code)
        sandbox.close()

The asynchronous client (``AsyncSandboxClient``) is ``orchard.sandbox.async_client``, what both share
``orchard.sandbox.client_wire``; both are importable from here too.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import websockets.exceptions
import websockets.sync.client

from orchard.sandbox import ExecResult, FileEntry, PtySession, Sandbox, SandboxInfo, SandboxSpec
from orchard.sandbox.api_models import PatchRequest, PtyExit, PtyResize
from orchard.sandbox.async_client import AsyncRemotePty, AsyncRemoteSandbox, AsyncSandboxClient
from orchard.sandbox.client_wire import (
    DEFAULT_TIMEOUT_S,
    EXEC_MARGIN_S,
    FILE_ENTRIES,
    KEEPALIVE_EXPIRY_S,
    SANDBOX_INFOS,
    StreamItem,
    bearer_headers,
    denial_error,
    exec_body,
    pty_url,
    quote_path,
    raise_for_error,
    stream_item,
)
from orchard.sandbox.exceptions import SandboxNotFoundError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "EXEC_MARGIN_S",
    "KEEPALIVE_EXPIRY_S",
    "AsyncRemotePty",
    "AsyncRemoteSandbox",
    "AsyncSandboxClient",
    "RemotePty",
    "RemoteSandbox",
    "SandboxClient",
    "StreamItem",
    "quote_path",
    "raise_for_error",
]

_SYNC_WS_OPTIONS: dict[str, Any] = (
    {"legacy": True} if "legacy" in inspect.signature(websockets.sync.client.connect).parameters else {}
)
"""websockets 15+ warns unless a directly held (not ``with``) sync connection says so; older versions lack it."""


class SandboxClient:
    """Synchronous client of the sandbox API."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``base_url`` like ``http://127.0.0.1:8000``; ``token`` the API's bearer token."""
        self.base_url, self.token = base_url.rstrip("/"), token
        headers = bearer_headers(token)
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport, limits=limits
        )

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections."""
        self.http.close()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One API call; an error response raises its ``SandboxError``."""
        response = self.http.request(method, url, **kwargs)
        raise_for_error(response)
        return response

    def healthz(self) -> bool:
        """Whether the service answers."""
        return self.http.get("/healthz").status_code == 200

    def create(self, spec: SandboxSpec) -> RemoteSandbox:
        """Create a sandbox; it is ready for ``exec`` on return."""
        response = self.request("POST", "/sandboxes", json=spec.model_dump(mode="json"))
        return RemoteSandbox(self, SandboxInfo.model_validate_json(response.content))

    def get(self, sandbox_id: str) -> RemoteSandbox:
        """A live sandbox (``SandboxNotFoundError`` if unknown)."""
        return RemoteSandbox(self, self.info(sandbox_id))

    def info(self, sandbox_id: str) -> SandboxInfo:
        """A live sandbox's spec, lifetime and endpoints."""
        return SandboxInfo.model_validate_json(self.request("GET", f"/sandboxes/{quote(sandbox_id)}").content)

    def list(self) -> list[SandboxInfo]:
        """Every live sandbox."""
        return SANDBOX_INFOS.validate_json(self.request("GET", "/sandboxes").content)

    def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox (``SandboxNotFoundError`` if unknown)."""
        self.request("DELETE", f"/sandboxes/{quote(sandbox_id)}")


class RemoteSandbox(Sandbox):
    """A sandbox behind the REST API, usable wherever a ``Sandbox`` is."""

    def __init__(self, client: SandboxClient, info: SandboxInfo) -> None:
        """Made by ``SandboxClient.create``/``get``."""
        self.client, self.spec, self._info = client, info.spec, info
        self.url = f"/sandboxes/{quote(info.spec.sandbox_id)}"

    def info(self) -> SandboxInfo:
        """Fresh info from the server."""
        self._info = self.client.info(self.spec.sandbox_id)
        return self._info

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 60.0,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command and wait for it (stdin must be UTF-8 text)."""
        body = exec_body(command, timeout_s, cwd, env, stdin)
        response = self.client.request("POST", f"{self.url}/exec", json=body, timeout=timeout_s + EXEC_MARGIN_S)
        return ExecResult.model_validate_json(response.content)

    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[StreamItem]:
        """Output chunks as the server streams them, then ``("exit", code)``."""
        body = exec_body(command, timeout_s, cwd, None, None)
        timeout = timeout_s + EXEC_MARGIN_S
        with self.client.http.stream(
            "POST", f"{self.url}/exec", params={"stream": "true"}, json=body, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_error(response)
            for raw in response.iter_lines():
                item = stream_item(raw)
                if item is not None:
                    yield item

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file."""
        self.client.request("PUT", f"{self.url}/files/{quote_path(path)}", content=data, params={"mode": f"{mode:o}"})

    def read_file(self, path: str) -> bytes:
        """A file's content."""
        return self.client.request("GET", f"{self.url}/files/{quote_path(path)}").content

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path``."""
        params = {"path": path, "recursive": str(recursive).lower()}
        return FILE_ENTRIES.validate_json(self.client.request("GET", f"{self.url}/files", params=params).content)

    def delete_file(self, path: str) -> None:
        """Remove a file or directory tree."""
        self.client.request("DELETE", f"{self.url}/files/{quote_path(path)}")

    def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff."""
        body = PatchRequest(patch=patch).model_dump()
        response = self.client.request("POST", f"{self.url}/patch", json=body, timeout=DEFAULT_TIMEOUT_S * 3)
        return ExecResult.model_validate_json(response.content)

    def heartbeat(self) -> None:
        """Push the TTL deadline forward."""
        self._info = SandboxInfo.model_validate_json(self.client.request("POST", f"{self.url}/heartbeat").content)

    def close(self) -> None:
        """Delete the sandbox (no error if it is already gone)."""
        try:
            self.client.request("DELETE", self.url)
        except SandboxNotFoundError:
            pass

    def open_pty(self, command: Sequence[str] | str | None = None, *, cols: int = 80, rows: int = 24) -> RemotePty:
        """An interactive terminal over the API's WebSocket."""
        url = pty_url(self.client.base_url, self.spec.sandbox_id, command, cols, rows)
        headers = bearer_headers(self.client.token)
        try:
            connection = websockets.sync.client.connect(url, additional_headers=headers, **_SYNC_WS_OPTIONS)
        except websockets.exceptions.InvalidStatus as exc:
            raise denial_error(exc) from exc
        return RemotePty(connection)


class RemotePty(PtySession):
    """A ``PtySession`` over the API's WebSocket (synchronous)."""

    def __init__(self, connection: websockets.sync.client.ClientConnection) -> None:
        """Wraps an open connection."""
        self.connection = connection
        self.exit_code: int | None = None
        self._ended = False

    def read(self, max_bytes: int = 65536, timeout_s: float = 1.0) -> bytes | None:
        """Output bytes; ``None`` when nothing came in time; ``b""`` once the process ended."""
        if self._ended:
            return b""
        try:
            message = self.connection.recv(timeout=timeout_s)
        except TimeoutError:
            return None
        except websockets.exceptions.ConnectionClosed:
            self._ended = True
            return b""
        if isinstance(message, bytes):
            return message
        self.exit_code = PtyExit.model_validate_json(message).exit_code
        self._ended = True
        return b""

    def write(self, data: bytes) -> None:
        """Send keystrokes."""
        self.connection.send(data)

    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        self.connection.send(PtyResize(cols=cols, rows=rows).model_dump_json())

    def wait(self, timeout_s: float | None = None) -> int | None:
        """Read (and drop) output until the process exits; its status, or ``None`` on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ended:
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.read(timeout_s=remaining)
        return self.exit_code

    def close(self) -> None:
        """Close the connection (the server kills the process)."""
        self.connection.close()
