"""Relay TCP connections from listening sockets inside sandboxes to the proxy on the host.

One asyncio loop on one daemon thread serves every sandbox of a runtime: each sandbox has a listening socket that lives
in its network namespace (see ``orchard.sandbox.local.netns``), and each connection accepted there is piped, bytes both
ways with half-closes, to the proxy's address in the host namespace. Nothing else is reachable from the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from dataclasses import dataclass, field

from orchard.logging import get_logger

CONNECT_TIMEOUT_S = 10.0
CHUNK = 65536

log = get_logger("orchard.sandbox.local.proxy_bridge")


@dataclass(eq=False)
class BridgeListener:
    """One sandbox's door: its listening socket, the target, and the connections open through it."""

    name: str
    target: tuple[str, int]
    server: asyncio.Server | None = None
    writers: set[asyncio.StreamWriter] = field(default_factory=set)


class ProxyBridge:
    """A relay from many sandbox-side listening sockets to host-side targets, on one background loop."""

    def __init__(self) -> None:
        """Nothing starts until the first ``serve``."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="orchard-proxy-bridge", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def serve(self, sock: socket.socket, target: tuple[str, int], name: str) -> BridgeListener:
        """Accept connections on ``sock`` (already listening) and relay each to ``target``."""
        listener = BridgeListener(name, target)
        loop = self._running_loop()
        future = asyncio.run_coroutine_threadsafe(self._start(listener, sock), loop)
        future.result(timeout=CONNECT_TIMEOUT_S)
        return listener

    def stop(self, listener: BridgeListener) -> None:
        """Stop listening and cut every connection open through ``listener``."""
        if self._loop is None or self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._stop(listener), self._loop)
        with contextlib.suppress(TimeoutError, RuntimeError):
            future.result(timeout=CONNECT_TIMEOUT_S)

    def close(self) -> None:
        """Stop the loop thread (listeners should be stopped first)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=CONNECT_TIMEOUT_S)
        loop.close()

    async def _start(self, listener: BridgeListener, sock: socket.socket) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._relay(listener, reader, writer)

        listener.server = await asyncio.start_server(handle, sock=sock)

    async def _stop(self, listener: BridgeListener) -> None:
        if listener.server is not None:
            listener.server.close()
        for writer in list(listener.writers):
            writer.close()
        listener.writers.clear()

    async def _relay(
        self, listener: BridgeListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        listener.writers.add(writer)
        try:
            connect = asyncio.open_connection(*listener.target)
            up_reader, up_writer = await asyncio.wait_for(connect, CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            log.warning("proxy_bridge_connect_failed", sandbox=listener.name, target=listener.target, error=str(exc))
            listener.writers.discard(writer)
            writer.close()
            return
        listener.writers.add(up_writer)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                listener.writers.discard(w)
                w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close the other side; a reset ends the copy quietly."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        return
