"""The asynchronous (asyncio) client of the sandbox REST API: ``AsyncSandboxClient``, its ``AsyncRemoteSandbox``
(the ``Sandbox`` methods as coroutines) and ``AsyncRemotePty``, the twins of ``orchard.sandbox.client``'s
synchronous ones, with the same models and errors::

    async with AsyncSandboxClient("http://127.0.0.1:8000", token) as client:
        sandbox = await client.create(SandboxSpec(sandbox_id="ep-1", run_id="r", episode_id="ep-1", task_id="t"))
        print((await sandbox.exec(["pytest", "-q"], timeout_s=600)).exit_code)
        await sandbox.close()
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import websockets.asyncio.client
import websockets.exceptions

from orchard.sandbox import ExecResult, FileEntry, SandboxInfo, SandboxSpec
from orchard.sandbox import client_wire as wire
from orchard.sandbox.api_models import PatchRequest, PtyResize
from orchard.sandbox.exceptions import SandboxNotFoundError


class AsyncSandboxClient:
    """Asynchronous client of the sandbox API."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = wire.DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``base_url`` like ``http://127.0.0.1:8000``; ``token`` the API's bearer token."""
        self.base_url, self.token = base_url.rstrip("/"), token
        headers = wire.bearer_headers(token)
        limits = httpx.Limits(
            max_connections=1000, max_keepalive_connections=100, keepalive_expiry=wire.KEEPALIVE_EXPIRY_S
        )
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport, limits=limits
        )

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self.http.aclose()

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One API call; an error response raises its ``SandboxError``."""
        response = await self.http.request(method, url, **kwargs)
        wire.raise_for_error(response)
        return response

    async def healthz(self) -> bool:
        """Whether the service answers."""
        return (await self.http.get("/healthz")).status_code == 200

    async def create(self, spec: SandboxSpec) -> AsyncRemoteSandbox:
        """Create a sandbox; it is ready for ``exec`` on return."""
        response = await self.request("POST", "/sandboxes", json=spec.model_dump(mode="json"))
        return AsyncRemoteSandbox(self, SandboxInfo.model_validate_json(response.content))

    async def get(self, sandbox_id: str) -> AsyncRemoteSandbox:
        """A live sandbox (``SandboxNotFoundError`` if unknown)."""
        return AsyncRemoteSandbox(self, await self.info(sandbox_id))

    async def info(self, sandbox_id: str) -> SandboxInfo:
        """A live sandbox's spec, lifetime and endpoints."""
        response = await self.request("GET", f"/sandboxes/{quote(sandbox_id)}")
        return SandboxInfo.model_validate_json(response.content)

    async def list(self) -> list[SandboxInfo]:
        """Every live sandbox."""
        return wire.SANDBOX_INFOS.validate_json((await self.request("GET", "/sandboxes")).content)

    async def delete(self, sandbox_id: str) -> None:
        """Delete a sandbox (``SandboxNotFoundError`` if unknown)."""
        await self.request("DELETE", f"/sandboxes/{quote(sandbox_id)}")


class AsyncRemoteSandbox:
    """A sandbox behind the REST API, with the ``Sandbox`` methods as coroutines."""

    def __init__(self, client: AsyncSandboxClient, info: SandboxInfo) -> None:
        """Made by ``AsyncSandboxClient.create``/``get``."""
        self.client, self.spec, self.cached_info = client, info.spec, info
        self.url = f"/sandboxes/{quote(info.spec.sandbox_id)}"

    async def info(self) -> SandboxInfo:
        """Fresh info from the server."""
        self.cached_info = await self.client.info(self.spec.sandbox_id)
        return self.cached_info

    async def exec(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 60.0,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command and wait for it (stdin must be UTF-8 text)."""
        body = wire.exec_body(command, timeout_s, cwd, env, stdin)
        response = await self.client.request(
            "POST", f"{self.url}/exec", json=body, timeout=timeout_s + wire.EXEC_MARGIN_S
        )
        return ExecResult.model_validate_json(response.content)

    async def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> AsyncIterator[wire.StreamItem]:
        """Output chunks as the server streams them, then ``("exit", code)``."""
        body = wire.exec_body(command, timeout_s, cwd, None, None)
        timeout = timeout_s + wire.EXEC_MARGIN_S
        async with self.client.http.stream(
            "POST", f"{self.url}/exec", params={"stream": "true"}, json=body, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                wire.raise_for_error(response)
            async for raw in response.aiter_lines():
                item = wire.stream_item(raw)
                if item is not None:
                    yield item

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file."""
        url = f"{self.url}/files/{wire.quote_path(path)}"
        await self.client.request("PUT", url, content=data, params={"mode": f"{mode:o}"})

    async def read_file(self, path: str) -> bytes:
        """A file's content."""
        return (await self.client.request("GET", f"{self.url}/files/{wire.quote_path(path)}")).content

    async def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path``."""
        params = {"path": path, "recursive": str(recursive).lower()}
        response = await self.client.request("GET", f"{self.url}/files", params=params)
        return wire.FILE_ENTRIES.validate_json(response.content)

    async def delete_file(self, path: str) -> None:
        """Remove a file or directory tree."""
        await self.client.request("DELETE", f"{self.url}/files/{wire.quote_path(path)}")

    async def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff."""
        body = PatchRequest(patch=patch).model_dump()
        response = await self.client.request("POST", f"{self.url}/patch", json=body, timeout=wire.DEFAULT_TIMEOUT_S * 3)
        return ExecResult.model_validate_json(response.content)

    async def heartbeat(self) -> None:
        """Push the TTL deadline forward."""
        response = await self.client.request("POST", f"{self.url}/heartbeat")
        self.cached_info = SandboxInfo.model_validate_json(response.content)

    async def close(self) -> None:
        """Delete the sandbox (no error if it is already gone)."""
        try:
            await self.client.request("DELETE", self.url)
        except SandboxNotFoundError:
            pass

    async def open_pty(
        self, command: Sequence[str] | str | None = None, *, cols: int = 80, rows: int = 24
    ) -> AsyncRemotePty:
        """An interactive terminal over the API's WebSocket."""
        url = wire.pty_url(self.client.base_url, self.spec.sandbox_id, command, cols, rows)
        headers = wire.bearer_headers(self.client.token)
        try:
            connection = await websockets.asyncio.client.connect(url, additional_headers=headers)
        except websockets.exceptions.InvalidStatus as exc:
            raise wire.denial_error(exc) from exc
        return AsyncRemotePty(connection)


class AsyncRemotePty:
    """The asynchronous twin of ``RemotePty``."""

    def __init__(self, connection: websockets.asyncio.client.ClientConnection) -> None:
        """Wraps an open connection."""
        self.connection = connection
        self.exit_code: int | None = None
        self.ended = False

    async def read(self) -> bytes:
        """The next output bytes; ``b""`` once the process ended."""
        if self.ended:
            return b""
        try:
            message = await self.connection.recv()
        except websockets.exceptions.ConnectionClosed:
            self.ended = True
            return b""
        if isinstance(message, bytes):
            return message
        self.exit_code = json.loads(message).get("exit_code")
        self.ended = True
        return b""

    async def write(self, data: bytes) -> None:
        """Send keystrokes."""
        await self.connection.send(data)

    async def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        await self.connection.send(PtyResize(cols=cols, rows=rows).model_dump_json())

    async def close(self) -> None:
        """Close the connection (the server kills the process)."""
        await self.connection.close()
