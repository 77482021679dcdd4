"""Parse and check a harness's request before anything is forwarded: what gets recorded with the call.

Recorded messages are the chat ``messages``, or for the Responses API the ``input`` items (a string input becomes one
user message) preceded by ``{"role": "system", "content": instructions}`` when the request has ``instructions``, so
what the engine was shown is in the record. Sampling parameters are every top-level field that is not content,
transport or bookkeeping (``NOT_SAMPLING``), so new API options are recorded without a code change. An Anthropic
Messages request is translated into a chat completions request first (``producers.proxy.messages``) and recorded in
that form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic_core import from_json, to_json

from producers.proxy.exceptions import BadRequestError

ApiFlavour = Literal["CHAT", "RESPONSES", "MESSAGES"]
"""The API a harness speaks: OpenAI chat completions, OpenAI Responses, Anthropic Messages."""
RecordedFlavour = Literal["CHAT", "RESPONSES"]
"""The form a call is recorded (and forwarded) in: a Messages call goes to the engine as a chat completion."""

PATHS: dict[ApiFlavour, str] = {"CHAT": "/chat/completions", "RESPONSES": "/responses", "MESSAGES": "/chat/completions"}
NOT_SAMPLING = frozenset(
    {"model", "messages", "input", "instructions", "tools", "stream", "stream_options", "user", "metadata", "store"}
    | {"previous_response_id", "include", "prompt_cache_key", "service_tier", "safety_identifier"}
)


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """A checked request: the bytes to forward and what the ModelCall records of it (for a Messages request, the
    translated chat completions body and its messages and tools; ``stop_sequences`` tell a stop sequence's end)."""

    flavour: ApiFlavour
    raw: bytes
    model: str
    messages: list[Any]
    tools: list[Any]
    sampling: dict[str, Any]
    stream: bool
    choices: int
    stop_sequences: tuple[str, ...] = ()
    canonicalized: tuple[int, ...] = ()
    """Indexes of the ``messages`` that are re-serialised assistant turns replaced by their sampled form."""

    @property
    def path(self) -> str:
        """Path of the API under the backend's base URL."""
        return PATHS[self.flavour]

    @property
    def recorded_flavour(self) -> RecordedFlavour:
        """The ModelCall's ``api_flavour``: the form of the forwarded request and of what is recorded."""
        return "RESPONSES" if self.flavour == "RESPONSES" else "CHAT"


def parse_request(raw: bytes, flavour: ApiFlavour) -> ModelRequest:
    """Check ``raw`` as a chat or Responses request; raise ``BadRequestError`` naming what is wrong (a Messages
    request is parsed by ``producers.proxy.messages.parse_messages_request``)."""
    body = json_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("'model' is required and must be a non-empty string", code="missing_model")
    messages = _chat_messages(body) if flavour == "CHAT" else _responses_input(body)
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise BadRequestError("'tools' must be an array")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise BadRequestError("'stream' must be a boolean")
    choices = body.get("n") or 1
    if flavour == "CHAT" and (not isinstance(choices, int) or isinstance(choices, bool) or not 1 <= choices <= 128):
        raise BadRequestError("'n' must be an integer from 1 to 128")
    if stream and choices > 1:
        raise BadRequestError("the recording proxy does not support streaming with n > 1", code="unsupported")
    sampling = {key: value for key, value in body.items() if key not in NOT_SAMPLING}
    return ModelRequest(flavour, raw, model, messages, tools, sampling, bool(stream), choices)


def with_messages(request: ModelRequest, messages: list[Any], canonicalized: tuple[int, ...]) -> ModelRequest:
    """``request`` (chat form) with other ``messages`` (``canonicalized``: those replaced by their sampled form), in
    what is forwarded and what is recorded."""
    body = json_object(request.raw)
    body["messages"] = messages
    return replace(request, raw=to_json(body), messages=messages, canonicalized=canonicalized)


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body; ``BadRequestError`` if it is not one."""
    try:
        body = from_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object", code="invalid_json")
    return body


def _chat_messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' is required and must be a non-empty array", code="missing_messages")
    if not all(isinstance(message, dict) for message in messages):
        raise BadRequestError("every item of 'messages' must be an object")
    return messages


def _responses_input(body: Mapping[str, Any]) -> list[Any]:
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and all(isinstance(item, dict) for item in raw):
        items = list(raw)
    else:
        raise BadRequestError("'input' is required: a string or an array of objects", code="missing_input")
    instructions = body.get("instructions")
    if instructions:
        items.insert(0, {"role": "system", "content": instructions})
    return items
