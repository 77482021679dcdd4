"""OpenAI request bodies checked and normalised: chat completions and responses into one ``PromptRequest``, legacy
completions into a ``CompletionRequest``.

Both APIs end up as chat-template messages plus tools in the chat-completions shape, so the same conversation
renders to the same prompt tokens whichever API carried it. Departures from OpenAI, on purpose:

- ``seed`` and ``stop`` are accepted by ``/v1/responses`` too (OpenAI's has neither), so both APIs can be compared
  and replayed;
- ``tool_choice`` other than ``"none"`` does not constrain decoding (a small model cannot be forced to call a
  tool); it only decides whether tool calls are parsed out of the output (``"none"``: never);
- ``n > 1`` is refused with ``stream`` (the token-trace contract puts one trace on the last chunk);
- ``logprobs``/``top_logprobs`` are ignored: the raw logprob of every sampled token is in the ``orchard`` trace;
- ``previous_response_id`` is refused: the engine stores nothing, so the whole conversation must be in ``input``.

The legacy ``/v1/completions`` body (``completion_request``) takes ``prompt`` as text or token ids (one prompt or a
list of them), no chat template, and answers ``echo``/``logprobs`` the way vLLM does: ``echo: true, logprobs: 0,
max_tokens: 0`` scores a given token sequence. Its departures: ``stream``, ``suffix`` and ``best_of > 1`` are
refused; ``return_tokens_as_token_ids`` (a vLLM extension) is accepted; ``logprobs`` may be 0 to 20.

Every problem raises ``InvalidRequestError`` naming the parameter, which the app answers with HTTP 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchard.engines.exceptions import InvalidRequestError

Flavour = Literal["chat", "responses"]
Prompt = str | list[int]
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_STOP_STRINGS = 4
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_LOGPROBS = 20
MAX_PROMPTS = 128
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for the legacy API


@dataclass(frozen=True)
class PromptRequest:
    """What a request asks for, whichever API carried it."""

    flavour: Flavour
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    parse_tools: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    n: int
    stream: bool
    include_usage: bool
    body: Mapping[str, Any]


@dataclass(frozen=True)
class CompletionRequest:
    """A legacy ``/v1/completions`` request: raw prompts (text or token ids), no chat template."""

    model: str
    prompts: list[Prompt]
    max_tokens: int
    echo: bool
    logprobs: int | None
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None
    n: int
    tokens_as_ids: bool


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def chat_request(body: Mapping[str, Any]) -> PromptRequest:
    """A ``/v1/chat/completions`` body."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty array", "messages")
    tools = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(_list(body, "tools"))]
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return _prompt_request(
        "chat", body, [_message(m, f"messages[{i}]") for i, m in enumerate(messages)], tools, max_tokens
    )


def responses_request(body: Mapping[str, Any]) -> PromptRequest:
    """A ``/v1/responses`` body: ``input`` items become chat messages, ``instructions`` a system message."""
    if body.get("previous_response_id"):
        raise InvalidRequestError(
            "previous_response_id is not supported (nothing is stored): send the whole conversation as input",
            "previous_response_id",
        )
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise InvalidRequestError("'input' must be a string or a non-empty array of items", "input")
    messages = _items_to_messages(items)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequestError("'instructions' must be a string", "instructions")
        messages.insert(0, {"role": "system", "content": instructions})
    tools = [_responses_tool(tool, f"tools[{i}]") for i, tool in enumerate(_list(body, "tools"))]
    return _prompt_request("responses", body, messages, tools, body.get("max_output_tokens"))


def completion_request(body: Mapping[str, Any]) -> CompletionRequest:
    """A legacy ``/v1/completions`` body (see the module docstring)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string", "model")
    if _bool(body, "stream"):
        raise InvalidRequestError("stream is not supported by /v1/completions on this engine", "stream")
    if body.get("suffix"):
        raise InvalidRequestError("'suffix' is not supported", "suffix")
    if body.get("best_of") not in (None, 1):
        raise InvalidRequestError("'best_of' other than 1 is not supported", "best_of")
    return CompletionRequest(
        model=model,
        prompts=_prompts(body.get("prompt")),
        max_tokens=_int(body, "max_tokens", DEFAULT_COMPLETION_TOKENS, low=0),
        echo=_bool(body, "echo"),
        logprobs=_int(body, "logprobs", None, low=0, high=MAX_LOGPROBS),
        temperature=_float(body, "temperature", 1.0, low=0.0, high=2.0),
        top_p=_float(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
        stop=_stop(body.get("stop")),
        seed=_int(body, "seed", None),
        n=_int(body, "n", 1, low=1, high=128),
        tokens_as_ids=_bool(body, "return_tokens_as_token_ids"),
    )


def _prompts(raw: Any) -> list[Prompt]:
    """``prompt``: a string, an array of token ids, or an array of either (a batch)."""
    if isinstance(raw, str) or _is_token_ids(raw):
        prompts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(p, str) or _is_token_ids(p) for p in raw):
        prompts = list(raw)
    else:
        raise InvalidRequestError(
            "'prompt' must be a string, a non-empty array of token ids, or a non-empty array of either", "prompt"
        )
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequestError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}", "prompt")
    if any(not p for p in prompts):
        raise InvalidRequestError("a prompt must not be empty", "prompt")
    return prompts


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def _prompt_request(
    flavour: Flavour,
    body: Mapping[str, Any],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    max_tokens: Any,
) -> PromptRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' must be a non-empty string", "model")
    n = _int(body, "n", 1, low=1, high=128)
    stream = _bool(body, "stream")
    if stream and n > 1:
        raise InvalidRequestError("n > 1 is not supported with stream", "n")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, Mapping):
        raise InvalidRequestError("'stream_options' must be an object", "stream_options")
    return PromptRequest(
        flavour=flavour,
        model=model,
        messages=messages,
        tools=tools,
        parse_tools=bool(tools) and body.get("tool_choice") != "none",
        max_tokens=None if max_tokens is None else _int({"max_tokens": max_tokens}, "max_tokens", None, low=1),
        temperature=_float(body, "temperature", 1.0, low=0.0, high=2.0),
        top_p=_float(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
        stop=_stop(body.get("stop")),
        seed=_int(body, "seed", None),
        n=n,
        stream=stream,
        include_usage=bool(stream_options.get("include_usage")),
        body=body,
    )


# ---------------------------------------------------------------------------------------------------- messages
def _message(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise InvalidRequestError(f"{where} must be an object", where)
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {sorted(ROLES)}", f"{where}.role")
    message: dict[str, Any] = {"role": "system" if role == "developer" else role}
    message["content"] = _text(raw.get("content"), f"{where}.content")
    if role == "assistant" and raw.get("tool_calls"):
        message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(raw["tool_calls"])]
    if role == "tool":
        message["tool_call_id"] = str(raw.get("tool_call_id", ""))
    return message


def _text(content: Any, where: str) -> str | None:
    """Content as text: a string, null, or an array of text parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping) and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
            else:
                raise InvalidRequestError(f"{where} has a part this engine cannot read (text parts only)", where)
        return "".join(parts)
    raise InvalidRequestError(f"{where} must be a string, null or an array of text parts", where)


def _tool_call(raw: Any, where: str) -> dict[str, Any]:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise InvalidRequestError(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", where)
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = str(raw.get("id") or "")
    return {"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _items_to_messages(items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidRequestError(f"{where} must be an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message({k: v for k, v in item.items() if k != "type"}, where))
        elif kind == "function_call":
            call = _tool_call({"id": item.get("call_id"), "function": item}, where)
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "content": output, "tool_call_id": str(item.get("call_id", ""))})
        elif kind != "reasoning":  # reasoning items carry nothing this engine renders
            raise InvalidRequestError(f"{where} has unsupported type {kind!r}", f"{where}.type")
    return messages


# ---------------------------------------------------------------------------------------------------- tools
def _chat_tool(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or raw.get("type") != "function" or not isinstance(raw.get("function"), Mapping):
        raise InvalidRequestError(f"{where} must be {{'type': 'function', 'function': {{...}}}}", where)
    return {"type": "function", "function": _function(raw["function"], f"{where}.function")}


def _responses_tool(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping) or raw.get("type") != "function":
        kind = raw.get("type") if isinstance(raw, Mapping) else None
        raise InvalidRequestError(f"{where}: only function tools are supported, not {kind!r}", where)
    return {"type": "function", "function": _function(raw, where)}


def _function(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    name = raw.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise InvalidRequestError(f"{where}.name must match {FUNCTION_NAME.pattern}", f"{where}.name")
    function: dict[str, Any] = {"name": name}
    description = raw.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise InvalidRequestError(f"{where}.description must be a string", f"{where}.description")
        function["description"] = description
    parameters = raw.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise InvalidRequestError(
                f"{where}.parameters must be a JSON Schema object ({{'type': 'object', ...}})", f"{where}.parameters"
            )
        properties = parameters.get("properties", {})
        if not isinstance(properties, Mapping) or not all(isinstance(v, Mapping) for v in properties.values()):
            raise InvalidRequestError(f"{where}.parameters.properties must map names to schemas", f"{where}.parameters")
        function["parameters"] = dict(parameters)
    return function


# ---------------------------------------------------------------------------------------------------- scalars
def _list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(f"'{key}' must be an array", key)
    return value


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequestError(f"'{key}' must be a boolean", key)
    return value


def _int(
    body: Mapping[str, Any], key: str, default: int | None, low: int | None = None, high: int | None = None
) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"'{key}' must be an integer", key)
    if low is not None and value < low:
        raise InvalidRequestError(f"'{key}' must be at least {low}, got {value}", key)
    if high is not None and value > high:
        raise InvalidRequestError(f"'{key}' must be at most {high}, got {value}", key)
    return value


def _float(
    body: Mapping[str, Any], key: str, default: float, *, low: float, high: float, low_open: bool = False
) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidRequestError(f"'{key}' must be a number", key)
    if value > high or value < low or (low_open and value == low):
        raise InvalidRequestError(f"'{key}' must be in {'(' if low_open else '['}{low}, {high}], got {value}", key)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(f"'stop' must be a string or an array of at most {MAX_STOP_STRINGS} strings", "stop")
    return tuple(s for s in stops if s)
