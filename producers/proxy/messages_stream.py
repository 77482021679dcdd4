"""A streamed chat completion relayed as an Anthropic Messages stream, while it is assembled for recording.

The backend streams chat chunks; the harness gets Messages events as the chunks arrive:

.. code-block:: text

    message_start, ping,
    (content_block_start, content_block_delta..., content_block_stop) per block,
    message_delta (stop_reason, stop_sequence, usage), message_stop

Blocks open in the order their first delta arrives: ``thinking`` (``thinking_delta``, from ``reasoning_content``),
``text`` (``text_delta``), one ``tool_use`` per tool call (its id and name at the start, its arguments as
``input_json_delta`` pieces). A new kind of delta, or another tool call, closes the open block. The chunks are
assembled exactly as a chat stream is (``ChatStreamAssembler``), so the call is recorded as its non-streamed
equivalent. Usage comes from the engine's trace, which arrives with the last chunk: ``message_start`` carries zero
tokens, ``message_delta`` the real input and output counts. An error the backend streams, or one the proxy meets
after the headers went out, becomes an ``error`` event and ends the stream (no ``message_stop``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import to_json

from producers.proxy.completion import ChatStreamAssembler
from producers.proxy.exceptions import BackendError, ProxyError
from producers.proxy.messages_reply import anthropic_error, message_id, stop_reason, usage
from producers.proxy.sse import SseEvent

Event = dict[str, Any]
BlockKey = tuple[str, int]


def encode(event: Event) -> bytes:
    """One Messages event, named by its type."""
    return f"event: {event['type']}\ndata: {to_json(event).decode()}\n\n".encode()


class MessagesStreamAssembler(ChatStreamAssembler):
    """Chat chunks in, Messages events out; the recorded completion as a chat stream gives it."""

    def __init__(self, model: str, stop_sequences: Sequence[str] = ()) -> None:
        """``model``: the model the request named; ``stop_sequences``: its stop sequences."""
        super().__init__()
        self.model, self.stop_sequences = model, tuple(stop_sequences)
        self.id = message_id()
        self._started = self._ended = False
        self._open: BlockKey | None = None
        self._blocks = 0
        self._backend_stop: Any = None

    def relay_other(self, event: SseEvent) -> bytes:
        """Comments and keep-alives are not passed on."""
        return b""

    def relay_chunk(self, event: SseEvent, chunk: dict[str, Any], traced: bool) -> bytes:
        """The Messages events of one chat chunk."""
        events = self._start()
        for choice in chunk.get("choices") or ():
            self._backend_stop = choice.get("stop_reason") or self._backend_stop
            events += self._deltas(choice.get("delta") or {})
        return b"".join(map(encode, events))

    def relay_done(self, event: SseEvent) -> bytes:
        """``[DONE]``: the closing events (none after an error)."""
        return self.finish()

    def relay_error(self, event: SseEvent, chunk: dict[str, Any]) -> bytes:
        """The backend's streamed error as an ``error`` event."""
        error = chunk.get("error")
        message = str(error.get("message") or error) if isinstance(error, Mapping) else str(error)
        return self.error_event(BackendError(f"the backend failed: {message}"))

    def error_event(self, exc: ProxyError) -> bytes:
        """An ``error`` event, which ends the stream."""
        self._ended = True
        return encode(anthropic_error(exc))

    def finish(self) -> bytes:
        """Close the open block, then ``message_delta`` and ``message_stop`` (once)."""
        if self._ended:
            return b""
        self._ended = True
        trace = self.trace
        reason, sequence = stop_reason(self.finish_reason or "stop", self._backend_stop, self.stop_sequences)
        counts = usage(trace) if trace is not None else {"output_tokens": 0}
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}}
        events = [*self._start(), *self._close(), delta | {"usage": counts}, {"type": "message_stop"}]
        return b"".join(map(encode, events))

    def _start(self) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}, {"type": "ping"}]

    def _deltas(self, delta: Mapping[str, Any]) -> list[Event]:
        events: list[Event] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            events += self._block(("thinking", 0), {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if isinstance(text, str) and text:
            events += self._block(("text", 0), {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": text}))
        for part in delta.get("tool_calls") or ():
            events += self._tool_part(part)
        return events

    def _tool_part(self, part: Mapping[str, Any]) -> list[Event]:
        function = part.get("function") or {}
        key = ("tool_use", int(part.get("index", 0)))
        events: list[Event] = []
        if self._open != key:
            call_id = part.get("id") or f"toolu_{self.id[4:]}_{key[1]}"
            start = {"type": "tool_use", "id": call_id, "name": function.get("name") or "", "input": {}}
            events += self._block(key, start)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return events

    def _block(self, key: BlockKey, start: Event) -> list[Event]:
        """Open the block ``key`` (closing the open one) unless it is the open one."""
        if self._open == key:
            return []
        events = self._close()
        self._open = key
        events.append({"type": "content_block_start", "index": self._blocks, "content_block": start})
        return events

    def _delta(self, delta: Event) -> Event:
        return {"type": "content_block_delta", "index": self._blocks, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        self._blocks += 1
        return [{"type": "content_block_stop", "index": self._blocks - 1}]
