"""Python SDK for the sandbox REST API: ``SandboxClient`` (sync, httpx) and ``AsyncSandboxClient`` (asyncio).

Both return the models of ``orchard.sandbox`` and raise the errors of ``orchard.sandbox.exceptions`` the server
raised (by the error body's code). A ``RemoteSandbox`` is a ``Sandbox``, so code written against the runtime
interface runs unchanged against a remote service::

    with SandboxClient("http://127.0.0.1:8000", token) as client:
        sandbox = client.create(SandboxSpec(sandbox_id="ep-1", run_id="r", episode_id="ep-1", task_id="t"))
        print(sandbox.exec(["pytest", "-q"], timeout_s=600).exit_code)
        sandbox.close()
"""

from __future__ import annotations

import inspect
import json
import shlex
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote, urlencode

import httpx
import websockets.asyncio.client
import websockets.exceptions
import websockets.sync.client
from pydantic import TypeAdapter, ValidationError

from orchard.sandbox import ExecResult, FileEntry, PtySession, Sandbox, SandboxInfo, SandboxSpec
from orchard.sandbox.api_models import ExecRequest, PatchRequest, PtyExit, PtyResize, StreamLine
from orchard.sandbox.exceptions import ERRORS_BY_CODE, InvalidSandboxRequestError, SandboxError, SandboxNotFoundError

DEFAULT_TIMEOUT_S = 30.0
KEEPALIVE_EXPIRY_S = 2.0
"""Idle connections are dropped well before the server's keep-alive timeout (uvicorn: 5 s), so a request never
races the server closing the connection it was sent on."""
EXEC_MARGIN_S = 30.0
"""HTTP read timeout of an exec beyond the command's own timeout."""
StreamItem = tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]

_SYNC_WS_OPTIONS: dict[str, Any] = (
    {"legacy": True} if "legacy" in inspect.signature(websockets.sync.client.connect).parameters else {}
)
"""websockets 15+ warns unless a directly held (not ``with``) sync connection says so; older versions lack it."""
_INFOS = TypeAdapter(list[SandboxInfo])
_ENTRIES = TypeAdapter(list[FileEntry])


def quote_path(path: str) -> str:
    """A sandbox path as URL path segments, ``.``/``..`` percent-encoded so that URL normalisation keeps them.

    >>> quote_path("a b/../c")
    'a%20b/%2E%2E/c'
    """
    segments = []
    for segment in path.split("/"):
        if segment in (".", ".."):
            segments.append(segment.replace(".", "%2E"))
        else:
            segments.append(quote(segment, safe=""))
    return "/".join(segments)


def raise_for_error(response: httpx.Response) -> None:
    """Raise the ``SandboxError`` subclass named by an error body (``SandboxError`` for anything unknown)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
        code, message = body["error"], body["message"]
    except (ValueError, KeyError, TypeError):
        code, message = "sandbox_error", f"HTTP {response.status_code}: {response.text[:500]}"
    raise ERRORS_BY_CODE.get(code, SandboxError)(message)


def _denial_error(exc: websockets.exceptions.InvalidStatus) -> SandboxError:
    """The ``SandboxError`` a refused WebSocket handshake stands for (its body is the API's JSON error)."""
    try:
        body = json.loads(exc.response.body or b"")
        return ERRORS_BY_CODE.get(body["error"], SandboxError)(body["message"])
    except (ValueError, KeyError, TypeError):
        return SandboxError(str(exc))


def _exec_body(
    command: Sequence[str] | str, timeout_s: float, cwd: str, env: Mapping[str, str] | None, stdin: bytes | None
) -> dict[str, Any]:
    """The JSON body of an exec; a command the server would refuse raises ``InvalidSandboxRequestError`` here, as a
    runtime's own sandbox would."""
    command_value: list[str] | str = command if isinstance(command, str) else list(command)
    try:
        text = stdin.decode() if stdin is not None else None
        request = ExecRequest(
            command=command_value, timeout_s=timeout_s, cwd=cwd, env=dict(env) if env else None, stdin=text
        )
    except UnicodeDecodeError as exc:
        raise InvalidSandboxRequestError(f"stdin is not UTF-8 text: {exc}") from exc
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())
        raise InvalidSandboxRequestError(reasons) from exc
    return request.model_dump(exclude_none=True)


def _stream_item(raw: str) -> StreamItem | None:
    """One NDJSON line as ``Sandbox.exec_stream`` yields it (``None`` for a blank line)."""
    if not raw.strip():
        return None
    line = StreamLine.model_validate_json(raw)
    if line.stream == "error":
        raise ERRORS_BY_CODE.get(line.error or "", SandboxError)(line.message or "exec failed")
    if line.stream == "exit":
        return "exit", line.exit_code
    return line.stream, (line.data or "").encode()


def _ws_url(base_url: str, sandbox_id: str, command: Sequence[str] | str | None, cols: int, rows: int) -> str:
    params: dict[str, Any] = {"cols": cols, "rows": rows}
    if command is not None:
        params["command"] = command if isinstance(command, str) else shlex.join(command)
    ws_base = "ws" + base_url.removeprefix("http")
    return f"{ws_base.rstrip('/')}/sandboxes/{quote(sandbox_id)}/pty?{urlencode(params)}"


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
        headers = {"Authorization": f"Bearer {token}"}
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
        return _INFOS.validate_json(self.request("GET", "/sandboxes").content)

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
        body = _exec_body(command, timeout_s, cwd, env, stdin)
        response = self.client.request("POST", f"{self.url}/exec", json=body, timeout=timeout_s + EXEC_MARGIN_S)
        return ExecResult.model_validate_json(response.content)

    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[StreamItem]:
        """Output chunks as the server streams them, then ``("exit", code)``."""
        body = _exec_body(command, timeout_s, cwd, None, None)
        timeout = timeout_s + EXEC_MARGIN_S
        with self.client.http.stream(
            "POST", f"{self.url}/exec", params={"stream": "true"}, json=body, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_error(response)
            for raw in response.iter_lines():
                item = _stream_item(raw)
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
        return _ENTRIES.validate_json(self.client.request("GET", f"{self.url}/files", params=params).content)

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
        url = _ws_url(self.client.base_url, self.spec.sandbox_id, command, cols, rows)
        headers = {"Authorization": f"Bearer {self.client.token}"}
        try:
            connection = websockets.sync.client.connect(url, additional_headers=headers, **_SYNC_WS_OPTIONS)
        except websockets.exceptions.InvalidStatus as exc:
            raise _denial_error(exc) from exc
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


class AsyncSandboxClient:
    """Asynchronous client of the sandbox API."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``base_url`` like ``http://127.0.0.1:8000``; ``token`` the API's bearer token."""
        self.base_url, self.token = base_url.rstrip("/"), token
        headers = {"Authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100, keepalive_expiry=KEEPALIVE_EXPIRY_S)
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
        raise_for_error(response)
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
        return _INFOS.validate_json((await self.request("GET", "/sandboxes")).content)

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
        body = _exec_body(command, timeout_s, cwd, env, stdin)
        response = await self.client.request("POST", f"{self.url}/exec", json=body, timeout=timeout_s + EXEC_MARGIN_S)
        return ExecResult.model_validate_json(response.content)

    async def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> AsyncIterator[StreamItem]:
        """Output chunks as the server streams them, then ``("exit", code)``."""
        body = _exec_body(command, timeout_s, cwd, None, None)
        timeout = timeout_s + EXEC_MARGIN_S
        async with self.client.http.stream(
            "POST", f"{self.url}/exec", params={"stream": "true"}, json=body, timeout=timeout
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_error(response)
            async for raw in response.aiter_lines():
                item = _stream_item(raw)
                if item is not None:
                    yield item

    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file."""
        url = f"{self.url}/files/{quote_path(path)}"
        await self.client.request("PUT", url, content=data, params={"mode": f"{mode:o}"})

    async def read_file(self, path: str) -> bytes:
        """A file's content."""
        return (await self.client.request("GET", f"{self.url}/files/{quote_path(path)}")).content

    async def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path``."""
        params = {"path": path, "recursive": str(recursive).lower()}
        return _ENTRIES.validate_json((await self.client.request("GET", f"{self.url}/files", params=params)).content)

    async def delete_file(self, path: str) -> None:
        """Remove a file or directory tree."""
        await self.client.request("DELETE", f"{self.url}/files/{quote_path(path)}")

    async def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff."""
        body = PatchRequest(patch=patch).model_dump()
        response = await self.client.request("POST", f"{self.url}/patch", json=body, timeout=DEFAULT_TIMEOUT_S * 3)
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
        url = _ws_url(self.client.base_url, self.spec.sandbox_id, command, cols, rows)
        headers = {"Authorization": f"Bearer {self.client.token}"}
        try:
            connection = await websockets.asyncio.client.connect(url, additional_headers=headers)
        except websockets.exceptions.InvalidStatus as exc:
            raise _denial_error(exc) from exc
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
