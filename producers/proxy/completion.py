"""What the backend answered: text, tool calls, finish reason and token trace, from a response or from its stream.

A streamed answer is assembled into exactly the ``Completion`` its non-streamed equivalent gives, so both are recorded
identically: chat tool calls are normalised to ``{"id", "type", "function": {"name", "arguments"}}`` either way, and
a Responses stream is read from the ``response`` of its terminal event (its ``output_item.done`` items only when that
response lists no output). The token trace (``orchard.engines.token_trace``) is removed from what the harness
receives; an answer without one is a ``BackendError``, since it cannot be recorded token-exactly.

Finish reason of a Responses answer (which reports none): ``tool_calls`` when it calls tools, else ``length`` when
it stopped at ``max_output_tokens``, else the incomplete reason, else ``stop``.

``ChatStreamAssembler`` hands each event on through its ``relay_*`` methods (as received, the trace taken out);
``producers.proxy.messages_stream`` overrides them to relay a chat stream as a Messages stream.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json, to_json

from orchard.engines.token_trace import TRACE_FIELD, TokenTrace
from producers.proxy.exceptions import BackendError, ProxyError
from producers.proxy.sse import SseEvent

TERMINAL_RESPONSE_EVENTS = frozenset({"response.completed", "response.incomplete"})
FAILED_RESPONSE_EVENTS = frozenset({"response.failed", "error"})


@dataclass(frozen=True, slots=True)
class Completion:
    """One completion as recorded."""

    text: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    trace: TokenTrace
    reasoning: str | None = None  # a chat answer's ``reasoning_content`` (or ``reasoning``), if the engine gave one


def read_trace(raw: Any) -> TokenTrace:
    """Validate a trace object; a missing or invalid one is a ``BackendError``."""
    if raw is None:
        raise BackendError("the backend answered without a token trace; the call cannot be recorded", code="no_trace")
    try:
        return TokenTrace.model_validate(raw)
    except ValidationError as exc:
        raise BackendError(f"the backend's token trace is invalid: {exc}", code="invalid_trace") from exc


def chat_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A chat tool call in its canonical recorded form."""
    function = call.get("function") or {}
    name, arguments = function.get("name") or "", function.get("arguments") or ""
    return {
        "id": call.get("id"),
        "type": call.get("type") or "function",
        "function": {"name": name, "arguments": arguments},
    }


def chat_completions(body: dict[str, Any]) -> list[Completion]:
    """The completions of a chat completion object (one per choice), removing every trace from ``body``."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise BackendError("the backend's chat completion has no choices")
    shared = body.pop(TRACE_FIELD, None)
    completions = []
    for choice in sorted(choices, key=lambda c: c.get("index", 0)):
        own = choice.pop(TRACE_FIELD, None)
        message = choice.get("message") or {}
        calls = [chat_tool_call(call) for call in message.get("tool_calls") or ()]
        trace = read_trace(own if own is not None else shared if len(choices) == 1 else None)
        finish = choice.get("finish_reason") or ("tool_calls" if calls else "stop")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        completions.append(Completion(_text(message.get("content")), calls, finish, trace, _optional(reasoning)))
    return completions


def responses_completion(response: dict[str, Any], items: list[dict[str, Any]] | None = None) -> Completion:
    """The completion of a Responses API response object (``items``: output gathered from a stream)."""
    trace = read_trace(response.pop(TRACE_FIELD, None))
    output = response.get("output") or items or []
    text = "".join(
        _text(part.get("text"))
        for item in output
        if item.get("type") == "message"
        for part in item.get("content") or ()
        if isinstance(part, dict) and part.get("type") in ("output_text", "text")
    )
    calls = [item for item in output if str(item.get("type", "")).endswith("_call")]
    return Completion(text, calls, _responses_finish(response, calls), trace)


def _responses_finish(response: Mapping[str, Any], calls: list[dict[str, Any]]) -> str:
    if calls:
        return "tool_calls"
    if response.get("status") == "incomplete":
        reason = str((response.get("incomplete_details") or {}).get("reason") or "length")
        return "length" if reason == "max_output_tokens" else reason
    return "stop"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _optional(text: Any) -> str | None:
    return text if isinstance(text, str) and text else None


def _load(data: str) -> dict[str, Any]:
    try:
        value = from_json(data)
    except ValueError as exc:
        raise BackendError(f"the backend streamed an unreadable event: {exc}") from exc
    if not isinstance(value, dict):
        raise BackendError("the backend streamed an event that is not a JSON object")
    return value


def _dump(value: Any) -> str:
    return to_json(value).decode()


def _openai_error(exc: ProxyError) -> Any:
    return exc.payload().get("error")


class StreamAssembler(ABC):
    """Reads a stream event by event, returns the bytes to pass on, and at the end the completion it carried."""

    def __init__(self) -> None:
        """Start with nothing seen."""
        self.backend_failed = False  # the backend reported an error in the stream (passed on as is)

    @abstractmethod
    def feed(self, event: SseEvent) -> bytes:
        """The bytes of ``event`` to send to the harness (trace removed); raise ``BackendError`` to stop."""

    @abstractmethod
    def completions(self) -> list[Completion]:
        """The completion(s) of the finished stream; ``BackendError`` if it ended without its trace."""

    def finish(self) -> bytes:
        """What to send after the backend's stream ended well (nothing: its own last event ends it)."""
        return b""

    @abstractmethod
    def error_event(self, exc: ProxyError) -> bytes:
        """The last event of a stream that failed once its headers were sent."""


class ChatStreamAssembler(StreamAssembler):
    """A streamed chat completion (one choice) assembled as its non-streamed equivalent."""

    def __init__(self) -> None:
        """Start with nothing seen."""
        super().__init__()
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._trace: TokenTrace | None = None

    def feed(self, event: SseEvent) -> bytes:
        """Accumulate one chunk; ``[DONE]`` is held back by an error when no trace came before it."""
        if event.data is None:
            return self.relay_other(event)
        if event.data.strip() == "[DONE]":
            if self._trace is None and not self.backend_failed:
                raise BackendError("the backend's stream ended without a token trace", code="no_trace")
            return self.relay_done(event)
        chunk = _load(event.data)
        if "error" in chunk and not chunk.get("choices"):
            self.backend_failed = True
            return self.relay_error(event, chunk)
        for choice in chunk.get("choices") or ():
            self._accumulate(choice)
        traced = TRACE_FIELD in chunk
        if traced:
            self._trace = read_trace(chunk.pop(TRACE_FIELD))
        return self.relay_chunk(event, chunk, traced)

    def relay_other(self, event: SseEvent) -> bytes:
        """An event without data (a comment, a keep-alive), passed on."""
        return event.encode()

    def relay_done(self, event: SseEvent) -> bytes:
        """``[DONE]``, passed on."""
        return event.encode()

    def relay_error(self, event: SseEvent, chunk: dict[str, Any]) -> bytes:
        """An error the backend streamed, passed on."""
        return event.encode()

    def relay_chunk(self, event: SseEvent, chunk: dict[str, Any], traced: bool) -> bytes:
        """A chunk, passed on (re-encoded when its trace was taken out)."""
        return event.with_data(_dump(chunk)) if traced else event.encode()

    def error_event(self, exc: ProxyError) -> bytes:
        """``data: {"error": ...}`` in place of ``[DONE]``."""
        return f"data: {_dump({'error': _openai_error(exc)})}\n\n".encode()

    @property
    def trace(self) -> TokenTrace | None:
        """The trace, once the chunk carrying it was read."""
        return self._trace

    @property
    def finish_reason(self) -> str | None:
        """The finish reason streamed so far."""
        return self._finish

    def _accumulate(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self._text.append(delta["content"])
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str):
            self._reasoning.append(reasoning)
        for part in delta.get("tool_calls") or ():
            call = self._calls.setdefault(int(part.get("index", 0)), {"id": None, "type": None, "name": "", "args": []})
            call["id"] = call["id"] or part.get("id")
            call["type"] = call["type"] or part.get("type")
            function = part.get("function") or {}
            call["name"] = call["name"] or function.get("name") or ""
            call["args"].append(function.get("arguments") or "")
        self._finish = choice.get("finish_reason") or self._finish

    def completions(self) -> list[Completion]:
        """The assembled completion."""
        if self._trace is None:
            raise BackendError("the backend's stream ended without a token trace", code="no_trace")
        calls = [
            chat_tool_call(
                {"id": c["id"], "type": c["type"], "function": {"name": c["name"], "arguments": "".join(c["args"])}}
            )
            for _, c in sorted(self._calls.items())
        ]
        finish = self._finish or ("tool_calls" if calls else "stop")
        reasoning = _optional("".join(self._reasoning))
        return [Completion("".join(self._text), calls, finish, self._trace, reasoning)]


class ResponsesStreamAssembler(StreamAssembler):
    """A streamed Responses API answer assembled from its terminal event."""

    def __init__(self) -> None:
        """Start with nothing seen."""
        super().__init__()
        self._items: list[dict[str, Any]] = []
        self._completion: Completion | None = None

    def feed(self, event: SseEvent) -> bytes:
        """Gather finished output items; take the trace out of the terminal event (an error if it has none)."""
        if event.data is None:
            return event.encode()
        body = _load(event.data)
        kind = body.get("type") or event.name
        if kind == "response.output_item.done" and isinstance(body.get("item"), dict):
            self._items.append(body["item"])
        elif kind in FAILED_RESPONSE_EVENTS:
            self.backend_failed = True
        elif kind in TERMINAL_RESPONSE_EVENTS:
            response = body.get("response")
            if not isinstance(response, dict):
                raise BackendError(f"the backend's {kind} event carries no response")
            self._completion = responses_completion(response, self._items)
            return event.with_data(_dump(body))
        return event.encode()

    def completions(self) -> list[Completion]:
        """The completion of the terminal event."""
        if self._completion is None:
            raise BackendError("the backend's stream ended before its response completed", code="no_trace")
        return [self._completion]

    def error_event(self, exc: ProxyError) -> bytes:
        """A ``response.failed`` event."""
        failed = {"type": "response.failed", "response": {"status": "failed", "error": _openai_error(exc)}}
        return f"event: response.failed\ndata: {_dump(failed)}\n\n".encode()
