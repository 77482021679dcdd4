"""A chat completion translated back into an Anthropic Message, and proxy errors in Anthropic's error format.

The Message is built from the backend's chat completion and the completion the proxy recorded of it:

- content: a ``thinking`` block when the engine reported reasoning (``reasoning_content``), a ``text`` block when
  there is text, one ``tool_use`` block per tool call (its id kept, ``input`` parsed from the arguments; arguments
  that are not a JSON object are given as ``{}``, the recording keeps the sampled tokens either way);
- ``stop_reason``: ``tool_use`` for tool calls, ``max_tokens`` for ``length``, ``stop_sequence`` (with
  ``stop_sequence``) when the backend names the stop string that ended generation (vLLM's ``stop_reason``), else
  ``end_turn``;
- ``usage``: the token counts of the engine's own trace (prompt and completion token ids), so a harness counting its
  context sees the engine's tokenizer.

Errors are ``{"type": "error", "error": {"type", "message"}}`` with the proxy's status; the error type follows the
status as Anthropic's does (400 ``invalid_request_error``, 401 ``authentication_error``, 404 ``not_found_error``,
413 ``request_too_large``, 429 ``rate_limit_error``, any 5xx ``api_error``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import from_json

from orchard.engines.token_trace import TokenTrace
from producers.proxy.completion import Completion
from producers.proxy.exceptions import ProxyError
from producers.proxy.request import ModelRequest

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def message_id() -> str:
    """A new Message id."""
    return f"msg_{uuid.uuid4().hex[:24]}"


def error_payload(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object for ``status``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error(exc: ProxyError) -> dict[str, Any]:
    """The error object of a proxy error (a backend's own 4xx keeps its status and message)."""
    return error_payload(exc.status, exc.message)


def stop_reason(finish: str, backend_stop: Any, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a chat finish reason.

    >>> stop_reason("tool_calls", None, ()), stop_reason("stop", "END", ["END"]), stop_reason("length", None, ())
    (('tool_use', None), ('stop_sequence', 'END'), ('max_tokens', None))
    """
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if isinstance(backend_stop, str) and backend_stop in stop_sequences:
        return "stop_sequence", backend_stop
    return "end_turn", None


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object of a ``tool_use`` block.

    >>> tool_input('{"cmd": "ls"}'), tool_input("not json"), tool_input("[1]")
    ({'cmd': 'ls'}, {}, {})
    """
    try:
        value = from_json(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def tool_use_block(call: Mapping[str, Any]) -> dict[str, Any]:
    """The ``tool_use`` block of a recorded chat tool call."""
    function = call.get("function") or {}
    call_id = call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}"
    arguments = tool_input(function.get("arguments") or "")
    return {"type": "tool_use", "id": call_id, "name": function.get("name") or "", "input": arguments}


def usage(trace: TokenTrace) -> dict[str, int]:
    """Token counts of a Message, from the engine's trace."""
    return {
        "input_tokens": len(trace.prompt_token_ids),
        "output_tokens": len(trace.completion_token_ids),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def messages_reply(body: Mapping[str, Any], completion: Completion, request: ModelRequest) -> dict[str, Any]:
    """The Message answering ``request``, from the backend's chat completion ``body`` (trace already removed)."""
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    content: list[dict[str, Any]] = []
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if completion.text:
        content.append({"type": "text", "text": completion.text})
    content += [tool_use_block(call) for call in completion.tool_calls]
    reason, sequence = stop_reason(completion.finish_reason, choice.get("stop_reason"), request.stop_sequences)
    return {
        "id": message_id(),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(completion.trace),
    }
