"""One model call through the proxy: forward it, answer the harness without the trace, record it in the background.

Each accepted request takes a ticket of its episode's ``CallSequencer`` at once, so calls are recorded in the order
they arrived. A non-streamed answer is parsed, stripped of its trace and returned; its recording is queued. A stream
is relayed event by event as it arrives; the call is recorded when the backend's stream ends, just before its last
batch is sent (from the same ``Completion`` a non-streamed answer gives). A call is recorded only when the backend
answered with a valid trace and the harness stayed for the answer (for a stream, until the backend's stream ended);
otherwise its ticket is released and nothing is recorded, and the episode counts why (``EpisodeSession.give_up``):
the harness went away (abandoned: it closed its connection while the proxy waited for the backend, or during the
stream), the backend refused the call with a 4xx (refused), or the backend failed, timed out, was unreachable or
answered without a valid trace (backend failed). While the backend works on a call, the proxy listens for the
harness's hang-up (``until_hung_up``; once a stream is relayed, Starlette's response does) and then cancels the
backend request: an answer no harness read is never recorded as a step of its episode. An error in the middle of a
stream, once headers are sent, reaches the harness as a last event: ``data: {"error": ...}`` on chat completions,
``response.failed`` on the Responses API, an ``error`` event on the Messages API.

A Messages call is forwarded as the chat completion it was translated into and answered as a Message
(``messages_reply``), or relayed as a Messages stream (``messages_stream``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from pydantic_core import to_json
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from orchard.logging import get_logger
from producers.proxy.backend import BackendClient, backend_errors
from producers.proxy.completion import (
    ChatStreamAssembler,
    Completion,
    ResponsesStreamAssembler,
    StreamAssembler,
    chat_completions,
    responses_completion,
)
from producers.proxy.episodes import AnsweredCall, EpisodeSession, Unrecorded
from producers.proxy.exceptions import BackendRejectedError, HarnessGoneError, ProxyError
from producers.proxy.messages_reply import messages_reply
from producers.proxy.messages_stream import MessagesStreamAssembler
from producers.proxy.request import ModelRequest
from producers.proxy.sse import iter_event_batches
from producers.proxy.upstream import UpstreamResponse

log = get_logger("proxy.forward")
T = TypeVar("T")
HangUp = Callable[[], Awaitable[object]]
"""Returns once the harness has closed its connection (never while it stays)."""


class CallForwarder:
    """Forwards calls of any episode to the backend and schedules their recording."""

    def __init__(self, backend: BackendClient) -> None:
        """Answers come from ``backend``."""
        self.backend = backend

    async def forward(
        self,
        session: EpisodeSession,
        request: ModelRequest,
        started: float,
        received_ms: int,
        hung_up: HangUp | None = None,
    ) -> Response:
        """Answer one call; ``started`` is its ``perf_counter`` at arrival, ``received_ms`` its wall-clock time,
        ``hung_up`` returns when the harness closes its connection (then the call is abandoned)."""
        ticket = session.take_ticket()
        try:
            if request.stream:
                return await self._open_relay(session, request, ticket, (started, received_ms), hung_up)
            body = await until_hung_up(self.backend.post(request.path, request.raw, session.spec.episode_id), hung_up)
            completions, answer = answered(request, body)
            content = to_json(answer)
        except BaseException as exc:
            session.give_up(ticket, unrecorded_reason(exc))
            raise
        latency_ms = (time.perf_counter() - started) * 1000
        session.spawn_record(ticket, AnsweredCall(request, completions, latency_ms, received_ms))
        return Response(content, media_type="application/json")

    async def _open_relay(
        self,
        session: EpisodeSession,
        request: ModelRequest,
        ticket: int,
        timing: tuple[float, int],
        hung_up: HangUp | None,
    ) -> Response:
        opening = self.backend.open_stream(request.path, request.raw, session.spec.episode_id)
        upstream = await until_hung_up(opening, hung_up)  # once relaying, Starlette's response listens for it
        relay = _StreamRelay(self, session, request, ticket, upstream, timing)
        return _RelayResponse(relay.events(), relay.close)


async def until_hung_up(work: Coroutine[Any, Any, T], hung_up: HangUp | None) -> T:
    """What ``work`` returns, unless the harness hangs up first: then ``work`` is cancelled (closing its backend
    connection) and ``HarnessGoneError`` raised."""
    if hung_up is None:
        return await work
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watch.exception() is None:
            task.cancel()
            await asyncio.wait((task,))
            raise HarnessGoneError("the harness closed its connection before the answer came")
        return await task  # done, or the watch failed (then the call goes on as if no one listened)
    finally:
        watch.cancel()
        task.cancel()


def answered(request: ModelRequest, body: dict[str, Any]) -> tuple[list[Completion], dict[str, Any]]:
    """The completions to record of a backend's answer (its trace taken out), and the answer for the harness."""
    if request.flavour == "RESPONSES":
        return [responses_completion(body)], body
    completions = chat_completions(body)
    if request.flavour == "MESSAGES":
        return completions, messages_reply(body, completions[0], request)
    return completions, body


def unrecorded_reason(exc: BaseException) -> Unrecorded:
    """Why a call that raised ``exc`` before it was answered is not recorded."""
    if isinstance(exc, asyncio.CancelledError | HarnessGoneError):
        return "abandoned"
    return "refused" if isinstance(exc, BackendRejectedError) else "backend_failed"


def stream_assembler(request: ModelRequest) -> StreamAssembler:
    """The assembler of a streamed answer to ``request``."""
    if request.flavour == "MESSAGES":
        return MessagesStreamAssembler(request.model, request.stop_sequences)
    return ChatStreamAssembler() if request.flavour == "CHAT" else ResponsesStreamAssembler()


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
        self.assembler = stream_assembler(request)
        self._owns_ticket = True
        self._unrecorded: Unrecorded = "abandoned"  # unless the stream ends otherwise

    async def events(self) -> AsyncIterator[bytes]:
        """The events to send; the call is recorded once the backend's stream has ended, before its last batch is
        handed over. A harness commonly hangs up as soon as it has the final event; recording after that last
        ``yield`` would lose such a call (the relay is cancelled at the ``yield``), so the last batch waits for it."""
        held: list[bytes] = []  # the latest batch, sent once the next one (or the end) has come
        try:
            timeout_s = self.forwarder.backend.timeout_s
            with backend_errors(timeout_s):
                async for batch in iter_event_batches(self.upstream.stream(timeout_s)):
                    if any(held):
                        yield b"".join(held)
                    held = []
                    for event in batch:  # one by one: what came before a failing event is still sent
                        held.append(self.assembler.feed(event))
            if self.assembler.backend_failed:
                self._unrecorded = "backend_failed"
                if any(held):
                    yield b"".join(held)
                return
            completions = self.assembler.completions()
        except ProxyError as exc:
            self.session.log.warning("stream failed", error=exc.message, code=exc.code)
            self._unrecorded = unrecorded_reason(exc)
            yield b"".join([*held, self.assembler.error_event(exc)])
            return
        except Exception:  # an answer the relay could not read: not the harness's doing
            self._unrecorded = "backend_failed"
            raise
        held.append(self.assembler.finish())
        latency_ms = (time.perf_counter() - self.started) * 1000
        self._owns_ticket = False
        self.session.spawn_record(self.ticket, AnsweredCall(self.request, completions, latency_ms, self.received_ms))
        if any(held):
            yield b"".join(held)

    async def close(self) -> None:
        """Release the ticket unless a recording took it over (counting why the call is not recorded: abandoned
        unless the stream failed), and close the backend stream."""
        if self._owns_ticket:
            self._owns_ticket = False
            self.session.give_up(self.ticket, self._unrecorded)
        await self.upstream.aclose()
