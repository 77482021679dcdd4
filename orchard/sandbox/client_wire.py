"""What the sync and async clients of the sandbox REST API share: the URLs and request bodies they send, and the
reading of what comes back (error bodies as the server's ``SandboxError``, streamed exec lines, refused WebSocket
handshakes)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import quote, urlencode

import httpx
import websockets.exceptions
from pydantic import TypeAdapter, ValidationError

from orchard.sandbox import FileEntry, SandboxInfo
from orchard.sandbox.api_models import ExecRequest, StreamLine
from orchard.sandbox.exceptions import ERRORS_BY_CODE, InvalidSandboxRequestError, SandboxError

DEFAULT_TIMEOUT_S = 30.0
KEEPALIVE_EXPIRY_S = 2.0
"""Idle connections are dropped well before the server's keep-alive timeout (uvicorn: 5 s), so a request never
races the server closing the connection it was sent on."""
EXEC_MARGIN_S = 30.0
"""HTTP read timeout of an exec beyond the command's own timeout."""
StreamItem = tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]
SANDBOX_INFOS = TypeAdapter(list[SandboxInfo])
FILE_ENTRIES = TypeAdapter(list[FileEntry])


def bearer_headers(token: str) -> dict[str, str]:
    """The headers that authorise a request (HTTP or WebSocket) with the API's bearer token."""
    return {"Authorization": f"Bearer {token}"}


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


def denial_error(exc: websockets.exceptions.InvalidStatus) -> SandboxError:
    """The ``SandboxError`` a refused WebSocket handshake stands for (its body is the API's JSON error)."""
    try:
        body = json.loads(exc.response.body or b"")
        return ERRORS_BY_CODE.get(body["error"], SandboxError)(body["message"])
    except (ValueError, KeyError, TypeError):
        return SandboxError(str(exc))


def exec_body(
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


def stream_item(raw: str) -> StreamItem | None:
    """One NDJSON line as ``Sandbox.exec_stream`` yields it (``None`` for a blank line)."""
    if not raw.strip():
        return None
    line = StreamLine.model_validate_json(raw)
    if line.stream == "error":
        raise ERRORS_BY_CODE.get(line.error or "", SandboxError)(line.message or "exec failed")
    if line.stream == "exit":
        return "exit", line.exit_code
    return line.stream, (line.data or "").encode()


def pty_url(base_url: str, sandbox_id: str, command: Sequence[str] | str | None, cols: int, rows: int) -> str:
    """The WebSocket URL of a sandbox's terminal (``command`` and the size as query parameters)."""
    params: dict[str, Any] = {"cols": cols, "rows": rows}
    if command is not None:
        params["command"] = command if isinstance(command, str) else shlex.join(command)
    ws_base = "ws" + base_url.removeprefix("http")
    return f"{ws_base.rstrip('/')}/sandboxes/{quote(sandbox_id)}/pty?{urlencode(params)}"
