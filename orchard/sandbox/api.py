"""The sandbox REST API over any ``Runtime``: create/get/list/delete sandboxes, exec (JSON or NDJSON stream), an
interactive PTY over WebSocket, files, patches, heartbeats; TTL reaping in the background.

Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>`` (a liveness probe learns nothing but
``{"status": "ok"}``). Errors are JSON ``{"error": code, "message": text}`` with a stable code per cause
(``orchard.sandbox.exceptions``): 401 ``unauthorized``, 404 ``sandbox_not_found`` / ``file_not_found``, 400
``path_escape`` / ``invalid_request``, 409 ``sandbox_exists``, 422 ``invalid_request`` for a malformed body (wrong
JSON types, unknown fields, a NUL byte in an argument, an environment name holding ``=``, more than a program can
receive). File paths in URLs are relative to the working copy; a client sends ``.``/``..`` segments percent-encoded
(``%2E%2E``), as URL normalisation would otherwise remove them before they reach the server; a URL whose
percent-encoding is not UTF-8 is refused rather than guessed at.

An error nobody anticipated is answered too, by a last line of defence (``LastLineOfDefence``): 400 when it is the
request's fault (text with no UTF-8 form, a name too long, arguments too big, a NUL byte that slipped through), else
500 with the traceback logged. Either way the connection stays open for the client's next request.

The runtime's calls block, so they run on worker threads under one capacity limiter sized for many long commands
at once (``max_blocking_calls``), not the small default pool.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import functools
import hmac
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes, urlsplit

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchard.logging import get_logger
from orchard.sandbox import ExecResult, FileEntry, PtySession, Runtime, Sandbox, SandboxInfo, SandboxSpec
from orchard.sandbox.api_models import (
    ErrorBody,
    ExecRequest,
    PatchRequest,
    PtyExit,
    PtyResize,
    StreamLine,
    check_argument,
    check_environment,
)
from orchard.sandbox.exceptions import InvalidSandboxRequestError, SandboxAuthError, SandboxError, SandboxNotFoundError
from orchard.sandbox.safe_fs import MAX_NAME_BYTES

T = TypeVar("T")
PTY_READ_TIMEOUT_S = 0.25
PTY_EXIT_WAIT_S = 5.0
WS_POLICY_VIOLATION = 1008
WS_INTERNAL_ERROR = 1011
MAX_FILE_MODE = 0o7777
MAX_TERMINAL_SIZE = 10_000
CLIENT_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.E2BIG, errno.EILSEQ})
"""Operating-system errors that only a request's own input causes (a name too long, arguments too big)."""
CLIENT_VALUE_ERRORS = ("embedded null byte", "illegal environment variable name", "Port out of range")
"""Messages of the ``ValueError``s that ``subprocess``, ``os`` and ``urllib`` raise for bad input."""

log = get_logger("orchard.sandbox.api")


class _Blocking:
    """Runs blocking runtime calls on worker threads under one (lazily made) capacity limiter."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._limiter: anyio.CapacityLimiter | None = None

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.limit)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=self._limiter)


def _authorized(connection: HTTPConnection, token: str) -> bool:
    scheme, _, presented = connection.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(ErrorBody(error=code, message=message).model_dump(), status_code=status, headers=headers)


def _error_for(exc: Exception) -> tuple[int, str, str]:
    """Status, code and message for an exception a runtime raised."""
    if isinstance(exc, SandboxError):
        return exc.status, exc.code, str(exc)
    if isinstance(exc, FileNotFoundError):
        return 404, "file_not_found", str(exc)
    if isinstance(exc, NotImplementedError):
        return 501, "not_implemented", str(exc)
    if _client_caused(exc):
        return 400, "invalid_request", f"the request cannot be carried out: {_describe(exc)}"
    return 500, "internal", _describe(exc)


def _client_caused(exc: Exception) -> bool:
    """Whether an unanticipated exception can only come from the request's own input.

    >>> _client_caused(ValueError("embedded null byte")), _client_caused(OSError(errno.E2BIG, "too long"))
    (True, True)
    >>> _client_caused(OSError(errno.EIO, "I/O error")), _client_caused(KeyError("x"))
    (False, False)
    """
    if isinstance(exc, UnicodeError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in CLIENT_ERRNOS
    return isinstance(exc, ValueError) and any(text in str(exc) for text in CLIENT_VALUE_ERRORS)


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def _log_fault(path: str, status: int, message: str, exc: BaseException) -> None:
    """Log a server fault with its traceback (client errors are the client's to read, not the log's)."""
    if status >= 500:
        log.error("sandbox_api_error", path=path, status=status, error=message, exc_info=exc)


ErrorRenderer = Callable[[int, str, str], Response]
"""Makes the error response of a status, a stable code and a message."""


class LastLineOfDefence:
    """ASGI middleware: an exception no handler took becomes an error response (400 if the request caused it, else
    500, logged with its traceback) instead of reaching the server, which would drop the keep-alive connection."""

    def __init__(self, app: ASGIApp, render: ErrorRenderer | None = None) -> None:
        """``render``: the error body (default: this API's ``{"error": code, "message": text}``)."""
        self.app = app
        self.render = render or _error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # too late for an error response; the server closes the connection
                log.error("sandbox_api_error_mid_response", path=scope.get("path"), exc_info=exc)
                raise
            status, code, message = _error_for(exc)
            _log_fault(str(scope.get("path")), status, message, exc)
            await self.render(status, code, message)(scope, receive, send)


def _install_error_handlers(app: FastAPI) -> None:
    async def runtime_error(request: Request, exc: Exception) -> JSONResponse:
        status, code, message = _error_for(exc)
        _log_fault(request.url.path, status, message, exc)
        return _error(status, code, message)

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        errors = exc.errors() if isinstance(exc, RequestValidationError) else []
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in errors]
        return _error(422, "invalid_request", "; ".join(parts) or str(exc))

    app.add_exception_handler(RequestValidationError, validation_error)
    for exc_type in (SandboxError, FileNotFoundError, NotImplementedError, UnicodeError, OSError, ValueError):
        app.add_exception_handler(exc_type, runtime_error)
    app.add_middleware(LastLineOfDefence)


def _utf8_url(request: Request) -> None:
    """Refuse a URL whose percent-encoded path or query is not UTF-8 (it would be decoded into other names)."""
    for raw in (request.scope.get("raw_path") or b"", request.scope.get("query_string") or b""):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidSandboxRequestError("the URL's percent-encoded path or query is not UTF-8") from None


def _check_spec(spec: SandboxSpec) -> None:
    """Refuse, before anything is made, a spec whose commands could never start or whose fields the host rejects."""
    try:
        check_environment(spec.env)
        if spec.source_dir is not None:
            check_argument(str(spec.source_dir), "source_dir")
            if any(len(part.encode()) > MAX_NAME_BYTES for part in spec.source_dir.parts):
                raise ValueError(f"source_dir {str(spec.source_dir)[:80]!r}... has a name over {MAX_NAME_BYTES} bytes")
    except ValueError as exc:
        raise InvalidSandboxRequestError(str(exc)) from None
    try:
        urlsplit(spec.proxy_url or "").port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as exc:
        raise InvalidSandboxRequestError(f"proxy_url {spec.proxy_url!r}: {exc}") from None


def create_sandbox_app(
    runtime: Runtime,
    token: str,
    *,
    reap_interval_s: float | None = 5.0,
    max_blocking_calls: int = 2048,
) -> FastAPI:
    """The sandbox API over ``runtime``; ``reap_interval_s`` (None: never) runs ``runtime.reap_expired`` that often."""
    if not token:
        raise ValueError("the sandbox API needs a non-empty bearer token")
    blocking = _Blocking(max_blocking_calls)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(_reap_forever(runtime, blocking, reap_interval_s)) if reap_interval_s else None
        try:
            yield
        finally:
            if reaper is not None:
                reaper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reaper

    def require_token(connection: HTTPConnection) -> None:
        if not _authorized(connection, token):
            raise SandboxAuthError("missing or wrong bearer token")

    app = FastAPI(title="Orchard sandboxes", lifespan=lifespan)
    _install_error_handlers(app)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    router = APIRouter(dependencies=[Depends(require_token), Depends(_utf8_url)])
    _sandbox_routes(router, runtime, blocking)
    _file_routes(router, runtime, blocking)
    app.include_router(router)
    _pty_route(app, runtime, blocking, token)
    return app


async def _reap_forever(runtime: Runtime, blocking: _Blocking, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            reaped = await blocking(runtime.reap_expired)
        except Exception as exc:  # noqa: BLE001 - the reaper must outlive one bad pass
            log.error("sandbox_reaper_failed", error=f"{type(exc).__name__}: {exc}")
            continue
        if reaped:
            log.info("sandboxes_reaped", sandboxes=reaped)


async def _sandbox(runtime: Runtime, blocking: _Blocking, sandbox_id: str) -> Sandbox:
    """``runtime.get`` on a worker thread (a remote backend may block), a ``KeyError`` made a 404."""
    try:
        return await blocking(runtime.get, sandbox_id)
    except SandboxNotFoundError:
        raise
    except KeyError:
        raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}") from None


def _sandbox_routes(router: APIRouter, runtime: Runtime, blocking: _Blocking) -> None:
    @router.post("/sandboxes", status_code=201)
    async def create(spec: SandboxSpec) -> SandboxInfo:
        _check_spec(spec)
        sandbox = await blocking(runtime.create, spec)
        return await blocking(sandbox.info)

    @router.get("/sandboxes")
    async def list_sandboxes() -> list[SandboxInfo]:
        sandboxes = await blocking(runtime.list)
        return await blocking(lambda: [sandbox.info() for sandbox in sandboxes])

    @router.get("/sandboxes/{sandbox_id}")
    async def get(sandbox_id: str) -> SandboxInfo:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        return await blocking(sandbox.info)

    @router.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def delete(sandbox_id: str) -> Response:
        await _sandbox(runtime, blocking, sandbox_id)
        await blocking(runtime.delete, sandbox_id)
        return Response(status_code=204)

    @router.post("/sandboxes/{sandbox_id}/heartbeat")
    async def heartbeat(sandbox_id: str) -> SandboxInfo:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        await blocking(sandbox.heartbeat)
        return await blocking(sandbox.info)

    @router.post("/sandboxes/{sandbox_id}/exec", response_model=None)
    async def exec_command(
        sandbox_id: str, request: ExecRequest, stream: bool = Query(False)
    ) -> ExecResult | StreamingResponse:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        if stream:
            if request.stdin is not None or request.env:
                raise InvalidSandboxRequestError("stream=true takes no stdin or env")
            lines = _ndjson(sandbox, request, blocking)
            return StreamingResponse(lines, media_type="application/x-ndjson")
        stdin = request.stdin.encode() if request.stdin is not None else None
        call = functools.partial(sandbox.exec, request.command, timeout_s=request.timeout_s, cwd=request.cwd)
        return await blocking(call, env=request.env, stdin=stdin)

    @router.post("/sandboxes/{sandbox_id}/patch")
    async def apply_patch(sandbox_id: str, request: PatchRequest) -> ExecResult:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        return await blocking(sandbox.apply_patch, request.patch)


async def _ndjson(sandbox: Sandbox, request: ExecRequest, blocking: _Blocking) -> AsyncIterator[bytes]:
    """Pull the sandbox's output stream on worker threads; closing early (client gone) kills the command."""
    chunks: Iterator[tuple[str, bytes | int | None]] = sandbox.exec_stream(
        request.command, timeout_s=request.timeout_s, cwd=request.cwd
    )
    decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
    loop_started = asyncio.get_running_loop().time()
    try:
        while True:
            try:
                item = await blocking(next, chunks, None)
            except Exception as exc:  # noqa: BLE001 - reported in the stream: the 200 status is already sent
                _, code, message = _error_for(exc)
                yield _line(StreamLine(stream="error", error=code, message=message))
                return
            if item is None:
                return
            kind, payload = item
            if kind == "exit":
                code = payload if isinstance(payload, int) else None
                elapsed_ms = (asyncio.get_running_loop().time() - loop_started) * 1000.0
                yield _line(StreamLine(stream="exit", exit_code=code, timed_out=code is None, duration_ms=elapsed_ms))
            elif isinstance(payload, bytes):
                text = decoders[kind].decode(payload)
                if text:
                    yield _line(StreamLine(stream=kind, data=text))  # type: ignore[arg-type]
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            with anyio.CancelScope(shield=True):  # the client went away: still kill the command
                await blocking(close)


def _line(line: StreamLine) -> bytes:
    return line.model_dump_json(exclude_none=True).encode() + b"\n"


def _file_routes(router: APIRouter, runtime: Runtime, blocking: _Blocking) -> None:
    @router.get("/sandboxes/{sandbox_id}/files")
    async def list_files(sandbox_id: str, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        return await blocking(sandbox.list_files, path, recursive)

    @router.put("/sandboxes/{sandbox_id}/files/{path:path}", status_code=204)
    async def write_file(sandbox_id: str, path: str, request: Request, mode: str = "644") -> Response:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        try:
            file_mode = int(mode, 8)
        except ValueError:
            raise InvalidSandboxRequestError(f"mode {mode!r} is not an octal number") from None
        if not 0 <= file_mode <= MAX_FILE_MODE:
            raise InvalidSandboxRequestError(f"mode {mode!r} is not a file mode (0 to {MAX_FILE_MODE:o})")
        data = await request.body()
        await blocking(sandbox.write_file, path, data, file_mode)
        return Response(status_code=204)

    @router.get("/sandboxes/{sandbox_id}/files/{path:path}")
    async def read_file(sandbox_id: str, path: str) -> Response:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        data = await blocking(sandbox.read_file, path)
        return Response(content=data, media_type="application/octet-stream")

    @router.delete("/sandboxes/{sandbox_id}/files/{path:path}", status_code=204)
    async def delete_file(sandbox_id: str, path: str) -> Response:
        sandbox = await _sandbox(runtime, blocking, sandbox_id)
        await blocking(sandbox.delete_file, path)
        return Response(status_code=204)


def _pty_route(app: FastAPI, runtime: Runtime, blocking: _Blocking, token: str) -> None:
    @app.websocket("/sandboxes/{sandbox_id}/pty")
    async def pty(
        websocket: WebSocket,
        sandbox_id: str,
        command: str | None = None,
        cols: int = Query(80, ge=1, le=MAX_TERMINAL_SIZE),
        rows: int = Query(24, ge=1, le=MAX_TERMINAL_SIZE),
    ) -> None:
        if not _authorized(websocket, token):
            await _deny(websocket, SandboxAuthError("missing or wrong bearer token"))
            return
        try:
            sandbox = await _sandbox(runtime, blocking, sandbox_id)
        except SandboxNotFoundError as exc:
            await _deny(websocket, exc)
            return
        await websocket.accept()
        try:
            session = await blocking(sandbox.open_pty, command, cols=cols, rows=rows)
        except Exception as exc:  # noqa: BLE001 - reported to the client as the close reason
            status, _, message = _error_for(exc)
            _log_fault(websocket.url.path, status, message, exc)
            await websocket.close(
                code=WS_INTERNAL_ERROR if status >= 500 else WS_POLICY_VIOLATION, reason=message[:120]
            )
            return
        try:
            await _serve_pty(websocket, session, blocking)
        finally:
            with anyio.CancelScope(shield=True):
                await blocking(session.close)


async def _deny(websocket: WebSocket, error: SandboxError) -> None:
    """Refuse the handshake with the same JSON error an HTTP route would give (a bare close if the server cannot)."""
    try:
        await websocket.send_denial_response(_error(error.status, error.code, str(error)))
    except RuntimeError:
        await websocket.close(code=WS_POLICY_VIOLATION, reason=str(error)[:120])


async def _serve_pty(websocket: WebSocket, session: PtySession, blocking: _Blocking) -> None:
    output = asyncio.create_task(_pty_output(websocket, session, blocking))
    keys = asyncio.create_task(_pty_input(websocket, session, blocking))
    done, pending = await asyncio.wait({output, keys}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
            await task
    if output in done and output.exception() is None:
        code = await blocking(session.wait, PTY_EXIT_WAIT_S)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):
            await websocket.send_text(PtyExit(exit_code=code).model_dump_json())
            await websocket.close()


async def _pty_output(websocket: WebSocket, session: PtySession, blocking: _Blocking) -> None:
    while True:
        data = await blocking(session.read, 65536, PTY_READ_TIMEOUT_S)
        if data is None:
            continue
        if not data:
            return
        await websocket.send_bytes(data)


async def _pty_input(websocket: WebSocket, session: PtySession, blocking: _Blocking) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("bytes"):
            await blocking(session.write, message["bytes"])
        elif message.get("text"):
            try:
                resize = PtyResize.model_validate_json(message["text"])
            except ValidationError:
                continue
            await blocking(session.resize, resize.cols, resize.rows)
