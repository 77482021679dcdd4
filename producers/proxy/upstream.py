"""A lean HTTP/1.1 client for the one backend the proxy forwards to: pooled keep-alive connections, nothing else.

The proxy sends a few kinds of request to one origin (POST a JSON body, GET ``/models``) and reads the answer whole or
as it streams. A general-purpose client spends more CPU per call than the rest of the proxy together (about 1.3 ms
for httpx against 0.15 ms here, measured on the benchmark's requests), and that is latency every model call pays, so
this module speaks just the HTTP/1.1 the backend answers with: a status line and headers, then a body delimited by
``Content-Length``, by chunked transfer encoding or by the end of the connection.

- **Pooling:** at most ``max_connections`` requests at once (more wait for a slot); a connection whose response was
  read to its end and did not say ``Connection: close`` goes back to the pool. A pooled connection the backend
  closed in the meantime (its keep-alive timeout) is noticed before reuse; if one still fails before a single byte of
  the answer came back, the request is sent once more on a new connection.
- **Streaming:** ``UpstreamResponse.stream`` yields the body as it arrives, everything buffered at once in one piece
  (a fast backend's many small chunks cost the relay one write, not one per chunk). Reading stops when the harness
  stops (the connection is then closed, never reused half-read); the socket's reading pauses while more than
  ``HIGH_WATER`` bytes wait unread.
- **Failures:** transport problems (refused, reset, an unreadable answer) raise ``UpstreamError``; timeouts are the
  caller's (``asyncio.timeout``) except the ``connect_timeout_s`` of a new connection and ``read_timeout_s`` between
  two pieces of a stream (``TimeoutError``). A cancelled request closes its connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
"""Largest status line plus headers accepted from the backend."""
HIGH_WATER = 1024 * 1024
"""Unread bytes at which the connection stops reading from its socket until the reader catches up."""
_NO_BODY_STATUSES = frozenset({204, 304})


class UpstreamError(ConnectionError):
    """The backend could not be reached, or its answer was cut off or is not HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: received bytes accumulate in ``buffer`` until a reader takes them."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102 - asyncio.Protocol
        self.transport = cast(asyncio.Transport, transport)  # a stream connection

    def data_received(self, data: bytes) -> None:  # noqa: D102 - asyncio.Protocol
        self.buffer += data
        if len(self.buffer) > HIGH_WATER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:  # noqa: D102 - asyncio.Protocol
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102 - asyncio.Protocol
        self.closed = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def more(self) -> None:
        """Wait until more bytes arrive or the connection ends (``UpstreamError`` if it already ended)."""
        if self.closed:
            raise UpstreamError(f"the backend closed the connection{f': {self.error}' if self.error else ''}")
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self, size: int | None = None) -> bytes:
        """Remove and return the first ``size`` buffered bytes (all of them by default)."""
        size = len(self.buffer) if size is None else size
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    @property
    def reusable(self) -> bool:
        """Open, and with nothing unread (a pooled connection must be idle)."""
        return not self.closed and not self.buffer and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """An answer whose head has been read; its body is read with ``read`` or ``stream``, then ``aclose`` (always)."""

    def __init__(
        self, pool: UpstreamPool, connection: _Connection, status: int, headers: dict[str, str], keep_alive: bool
    ) -> None:
        """Made by ``UpstreamPool.request``."""
        self.status, self.headers = status, headers
        self._pool, self._connection, self._keep_alive = pool, connection, keep_alive
        self._done = False
        self._released = False
        encoding = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._chunked = "chunked" in encoding
        self._remaining: int | None = None  # None: until the connection closes (or chunked)
        if status in _NO_BODY_STATUSES or 100 <= status < 200:
            self._remaining = 0
        elif not self._chunked and length is not None:
            if not length.strip().isdigit():
                raise UpstreamError(f"the backend sent an invalid Content-Length: {length!r}")
            self._remaining = int(length)
        self._chunk_left = 0  # bytes of the current chunk still to come (chunked)
        if self._remaining is None and not self._chunked:
            self._keep_alive = False
        self._done = self._remaining == 0 and not self._chunked

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool)."""
        parts = [part async for part in self.stream(None)]
        return b"".join(parts)

    async def stream(self, read_timeout_s: float | None) -> AsyncIterator[bytes]:
        """The body as it arrives: all that is buffered, in one piece, each time (``TimeoutError`` after
        ``read_timeout_s`` without a byte)."""
        connection = self._connection
        while not self._done:
            piece = self._decode()
            if piece:
                yield piece
                continue
            if self._done:
                break
            if connection.closed and self._remaining is None and not self._chunked:
                self._done = True  # the body ran to the end of the connection
                break
            if read_timeout_s is None:
                await connection.more()
            else:
                async with asyncio.timeout(read_timeout_s):
                    await connection.more()
        self._release()

    def _decode(self) -> bytes:
        """Take what the buffer holds of the body, decoded; set ``_done`` at its end."""
        buffer = self._connection.buffer
        if not self._chunked:
            if self._remaining is None:
                return self._connection.take()
            piece = self._connection.take(min(self._remaining, len(buffer)))
            self._remaining -= len(piece)
            self._done = self._remaining == 0
            return piece
        pieces: list[bytes] = []
        while buffer:
            if self._chunk_left:
                piece = self._connection.take(min(self._chunk_left, len(buffer)))
                self._chunk_left -= len(piece)
                pieces.append(piece)
                continue
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise UpstreamError("the backend sent an unreadable chunk header")
                break
            if buffer.startswith(b"\r\n"):  # the CRLF that ends a chunk's data
                del buffer[:2]
                continue
            size_text = bytes(buffer[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise UpstreamError(f"the backend sent an invalid chunk size: {size_text[:40]!r}") from None
            if size == 0:
                trailers_end = buffer.find(b"\r\n\r\n", line_end)
                if trailers_end < 0:
                    break  # wait for the (usually empty) trailers
                del buffer[: trailers_end + 4]
                self._done = True
                break
            del buffer[: line_end + 2]
            self._chunk_left = size
        return b"".join(pieces)

    async def aclose(self) -> None:
        """Give the connection back (only if the body was read to its end), and the pool slot."""
        self._release()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        reuse = self._done and self._keep_alive and self._chunk_left == 0
        self._pool.release(self._connection, reuse=reuse)


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections to one origin (``base_url``: scheme, host, port and path prefix)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        connect_timeout_s: float = 10.0,
    ) -> None:
        """``headers`` go with every request (``Host`` and ``Content-Length`` are added)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL with a host, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        authority = parts.netloc.rpartition("@")[2]
        fixed = {"host": authority, **{key.lower(): value for key, value in (headers or {}).items()}}
        self._fixed = "".join(f"{key}: {value}\r\n" for key, value in fixed.items()).encode("latin-1")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._closed = False

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        """Send a request (``path`` under the base URL's path) and read the answer's head."""
        extra = "".join(f"{key}: {value}\r\n" for key, value in (headers or {}).items()).encode("latin-1")
        target = f"{self.prefix}/{path.lstrip('/')}"
        length = f"content-length: {len(body)}\r\n".encode() if body or method in ("POST", "PUT", "PATCH") else b""
        message = b"".join([f"{method} {target} HTTP/1.1\r\n".encode("latin-1"), self._fixed, extra, length, b"\r\n"])
        await self._slots.acquire()
        try:
            connection, reused = await self._connection()
            try:
                return await self._exchange(connection, message, body)
            except UpstreamError as exc:
                if not (reused and exc.args and exc.args[-1] == "no answer"):
                    raise
            # A pooled connection the backend had closed just before: nothing was answered, so try a new one.
            connection, _ = await self._connection(fresh=True)
            return await self._exchange(connection, message, body)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, connection: _Connection, message: bytes, body: bytes) -> UpstreamResponse:
        try:
            if connection.transport is None:
                raise UpstreamError("the connection is not open")
            connection.transport.write(message + body if len(body) < 65536 else message)
            if len(body) >= 65536:
                connection.transport.write(body)
            while True:
                status, headers, keep_alive = await self._read_head(connection)
                if not 100 <= status < 200 or status == 101:
                    return UpstreamResponse(self, connection, status, headers, keep_alive)
        except BaseException:
            connection.close()
            raise

    async def _read_head(self, connection: _Connection) -> tuple[int, dict[str, str], bool]:
        buffer = connection.buffer
        while (end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise UpstreamError("the backend's response head is too large")
            if connection.closed:
                nothing = "no answer" if not buffer else "cut off"  # only an unanswered request may be sent again
                raise UpstreamError(f"the backend closed the connection: {connection.error}", nothing)
            await connection.more()
        lines = connection.take(end + 4)[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise UpstreamError(f"the backend's answer is not HTTP/1.x: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise UpstreamError(f"the backend sent an invalid header line: {line[:80]!r}")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        tokens = {token.strip() for token in headers.get("connection", "").lower().split(",")}
        keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
        return int(code), headers, keep_alive

    async def _connection(self, fresh: bool = False) -> tuple[_Connection, bool]:
        """An idle pooled connection (and True), or a new one (and False)."""
        if self._closed:
            raise UpstreamError("the client is closed")
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.reusable:
                return connection, True
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, protocol = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self._ssl, server_hostname=self.host if self._ssl else None
                )
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return protocol, False

    def release(self, connection: _Connection, *, reuse: bool) -> None:
        """Take a connection back after its response (pooled if ``reuse`` and still sound), and free its slot."""
        if reuse and connection.reusable and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()
        self._slots.release()

    async def aclose(self) -> None:
        """Close the idle connections; connections in use close when their responses are released."""
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()
