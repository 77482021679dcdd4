"""One model call through the proxy: forward it, answer the harness without the trace, record it in the background.

Each accepted request takes a ticket of its episode's ``CallSequencer`` at once, so calls are recorded in the order
they arrived. A non-streamed answer is parsed, stripped of its trace and returned; its recording is queued. A stream
is relayed event by event as it arrives; the call is recorded when the backend's stream ends, just before its last
batch is sent (from the same ``Completion`` a non-streamed answer gives). A call is recorded only when the backend
answered with a valid trace and, for a stream, the harness stayed until the backend's stream ended; otherwise its
ticket is released and nothing is recorded. An error in the middle of
a stream, once headers are sent, reaches the harness as a last event: ``data: {"error": ...}`` on chat completions,
``response.failed`` on the Responses API.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from pydantic_core import to_json
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from orchard.logging import get_logger
from producers.proxy.backend import BackendClient, backend_errors
from producers.proxy.completion import (
    ChatStreamAssembler,
    ResponsesStreamAssembler,
    StreamAssembler,
    chat_completions,
    responses_completion,
)
from producers.proxy.episodes import AnsweredCall, EpisodeSession
from producers.proxy.exceptions import ProxyError
from producers.proxy.request import ModelRequest
from producers.proxy.sse import iter_event_batches
from producers.proxy.upstream import UpstreamResponse

log = get_logger("proxy.forward")


class CallForwarder:
    """Forwards calls of any episode to the backend and schedules their recording."""

    def __init__(self, backend: BackendClient) -> None:
        """Answers come from ``backend``."""
        self.backend = backend

    async def forward(
        self, session: EpisodeSession, request: ModelRequest, started: float, received_ms: int
    ) -> Response:
        """Answer one call; ``started`` is its ``perf_counter`` at arrival, ``received_ms`` its wall-clock time."""
        ticket = session.take_ticket()
        try:
            if request.stream:
                return await self._open_relay(session, request, ticket, started, received_ms)
            body = await self.backend.post(request.path, request.raw, session.spec.episode_id)
            completions = chat_completions(body) if request.flavour == "CHAT" else [responses_completion(body)]
            content = to_json(body)
        except BaseException:
            session.sequencer.release(ticket)
            raise
        latency_ms = (time.perf_counter() - started) * 1000
        session.spawn_record(ticket, AnsweredCall(request, completions, latency_ms, received_ms))
        return Response(content, media_type="application/json")

    async def _open_relay(
        self, session: EpisodeSession, request: ModelRequest, ticket: int, started: float, received_ms: int
    ) -> Response:
        upstream = await self.backend.open_stream(request.path, request.raw, session.spec.episode_id)
        relay = _StreamRelay(self, session, request, ticket, upstream, (started, received_ms))
        return _RelayResponse(relay.events(), relay.close)


class _RelayResponse(StreamingResponse):
    """A streamed answer that always runs ``on_close`` once sent (or abandoned), even if never iterated."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


class _StreamRelay:
    """Relays one backend stream to the harness and records the call once the stream has ended."""

    def __init__(
        self,
        forwarder: CallForwarder,
        session: EpisodeSession,
        request: ModelRequest,
        ticket: int,
        upstream: UpstreamResponse,
        timing: tuple[float, int],
    ) -> None:
        self.forwarder, self.session, self.request, self.ticket = forwarder, session, request, ticket
        self.upstream = upstream
        self.started, self.received_ms = timing
        self.assembler: StreamAssembler = (
            ChatStreamAssembler() if request.flavour == "CHAT" else ResponsesStreamAssembler()
        )
        self._owns_ticket = True

    async def events(self) -> AsyncIterator[bytes]:
        """The events to send; the call is recorded once the backend's stream has ended, before its last batch is
        handed over. A harness commonly hangs up as soon as it has the final event; recording after that last
        ``yield`` would lose such a call (the relay is cancelled at the ``yield``), so the last batch waits for it."""
        held: bytes | None = None
        try:
            timeout_s = self.forwarder.backend.timeout_s
            with backend_errors(timeout_s):
                async for batch in iter_event_batches(self.upstream.stream(timeout_s)):
                    if held is not None:
                        yield held
                    held = b"".join([self.assembler.feed(event) for event in batch])
            if self.assembler.backend_failed:
                if held is not None:
                    yield held
                return
            completions = self.assembler.completions()
        except ProxyError as exc:
            self.session.log.warning("stream failed", error=exc.message, code=exc.code)
            yield (held or b"") + self._error_event(exc)
            return
        latency_ms = (time.perf_counter() - self.started) * 1000
        self._owns_ticket = False
        self.session.spawn_record(self.ticket, AnsweredCall(self.request, completions, latency_ms, self.received_ms))
        if held is not None:
            yield held

    def _error_event(self, exc: ProxyError) -> bytes:
        error = exc.payload()["error"]
        if self.request.flavour == "CHAT":
            return f"data: {json.dumps({'error': error})}\n\n".encode()
        failed = {"type": "response.failed", "response": {"status": "failed", "error": error}}
        return f"event: response.failed\ndata: {json.dumps(failed)}\n\n".encode()

    async def close(self) -> None:
        """Release the ticket unless a recording took it over, and close the backend stream."""
        if self._owns_ticket:
            self._owns_ticket = False
            self.session.sequencer.release(self.ticket)
        await self.upstream.aclose()
