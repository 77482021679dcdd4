"""Anthropic Messages requests translated into the chat completions requests the engine renders.

A ``POST /v1/messages`` body becomes a chat completions body; the engine renders it through its chat template like
any chat call, so the call is recorded token-exactly from the engine's own trace, in chat form (``api_flavour``
CHAT, ``harness_api`` MESSAGES). The answer goes back as a Message (``messages_reply``, ``messages_stream``).

- ``system`` (a string or text blocks) becomes the first message, ``{"role": "system", ...}``;
- user content: a string stays a string; text and image blocks become chat content parts (``text``; ``image_url``
  with a ``data:`` URL or the image's own URL; a plain-text document becomes text); each ``tool_result`` block
  becomes a ``tool`` message (``tool_use_id`` as ``tool_call_id``), placed before the user's other blocks, since
  chat wants tool messages right after the assistant's tool calls;
- assistant content: text blocks joined, ``tool_use`` blocks as ``tool_calls`` (the block's id kept, ``input``
  written as ``json.dumps(input, ensure_ascii=False)``, the engines' own form of arguments), ``thinking`` blocks as
  ``reasoning_content``; ``redacted_thinking`` blocks are dropped;
- ``tools`` (name, description, input_schema) become function tools; ``tool_choice`` auto/any/tool/none becomes
  ``"auto"``/``"required"``/the named function/``"none"``, ``disable_parallel_tool_use`` ``parallel_tool_calls``;
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` (as ``stop``) and ``stream`` are
  forwarded. ``thinking``, ``metadata`` and every other option are not forwarded; all but the content and
  ``metadata`` are recorded as the call's sampling parameters, as the harness sent them.

Departures, on purpose: ``cache_control``, citations and a tool result's ``is_error`` are dropped (chat has no place
for them); server tools (web search, code execution, ...) and documents other than plain text are refused (400).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic_core import to_json

from producers.proxy.exceptions import BadRequestError
from producers.proxy.request import ModelRequest, json_object

FORWARDED = ("max_tokens", "temperature", "top_p", "top_k")
NOT_SAMPLING = frozenset({"model", "messages", "system", "tools", "stream", "metadata"})
CUSTOM_TOOL_TYPES = frozenset({None, "custom"})
Block = Mapping[str, Any]


def parse_messages_request(raw: bytes) -> ModelRequest:
    """Check and translate a Messages request; ``BadRequestError`` naming what is wrong."""
    body = json_object(raw)
    chat = to_chat_body(body)
    sampling = {key: value for key, value in body.items() if key not in NOT_SAMPLING}
    stops = tuple(chat.get("stop", ()))
    tools = chat.get("tools", [])
    stream = bool(chat.get("stream"))
    return ModelRequest("MESSAGES", to_json(chat), chat["model"], chat["messages"], tools, sampling, stream, 1, stops)


def count_tokens_body(raw: bytes) -> bytes:
    """The chat body of a ``/v1/messages/count_tokens`` request (a Messages request without ``max_tokens``)."""
    chat = to_chat_body(json_object(raw))
    chat.pop("stream", None)
    return to_json(chat)


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat completions body of a Messages request body."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("'model' is required and must be a non-empty string", code="missing_model")
    chat: dict[str, Any] = {"model": model, "messages": [*_system(body.get("system")), *_conversation(body)]}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    return chat | _tool_choice(body.get("tool_choice")) | _options(body)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    blocks = _blocks(system, "system")
    if any(block.get("type") != "text" for block in blocks):
        raise BadRequestError("'system' must be a string or an array of text blocks")
    return [{"role": "system", "content": [_text_part(block, "system") for block in blocks]}]


def _conversation(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' is required and must be a non-empty array", code="missing_messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequestError(f"{where} must be an object")
        role, content = message.get("role"), message.get("content")
        if role == "user":
            out += _user(content, where)
        elif role == "assistant":
            out.append(_assistant(content, where))
        else:
            raise BadRequestError(f"{where}.role must be 'user' or 'assistant', not {role!r}")
    return out


def _blocks(content: Any, where: str) -> list[Block]:
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise BadRequestError(f"{where} must be a string or an array of content blocks")
    return content


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    results, parts = [], []
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_result":
            results.append(_tool_result(block, at))
        else:
            parts.append(_part(block, at))
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _part(block: Block, where: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return _text_part(block, where)
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": _image_url(block.get("source"), where)}}
    source = block.get("source")
    if kind == "document" and isinstance(source, dict) and source.get("type") == "text":
        return {"type": "text", "text": str(source.get("data", ""))}
    raise BadRequestError(f"{where}: content blocks of type {kind!r} are not supported", code="unsupported")


def _text_part(block: Block, where: str) -> dict[str, Any]:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequestError(f"{where}.text must be a string")
    return {"type": "text", "text": text}


def _image_url(source: Any, where: str) -> str:
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise BadRequestError(f"{where}.source must be a base64 or url image source")


def _tool_result(block: Block, where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequestError(f"{where}.tool_use_id is required")
    content = block.get("content", "")
    if not isinstance(content, str):
        blocks = _blocks(content, f"{where}.content")
        content = [_part(part, f"{where}.content[{k}]") for k, part in enumerate(blocks)]
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content, f"{where}.content")):
        at, kind = f"{where}.content[{j}]", block.get("type")
        if kind == "text":
            texts.append(_text_part(block, at)["text"])
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind != "redacted_thinking":
            raise BadRequestError(f"{at}: assistant blocks of type {kind!r} are not supported", code="unsupported")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _tool_call(block: Block, where: str) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise BadRequestError(f"{where} must be a tool_use block with a string id and name and an object input")
    encoded = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(tool, dict) for tool in raw):
        raise BadRequestError("'tools' must be an array of tool definitions")
    return [_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw)]


def _tool(tool: Mapping[str, Any], where: str) -> dict[str, Any]:
    if tool.get("type") not in CUSTOM_TOOL_TYPES:
        raise BadRequestError(f"{where}: server tools ({tool.get('type')!r}) are not supported", code="unsupported")
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequestError(f"{where}.name is required")
    function: dict[str, Any] = {"name": name, "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> dict[str, Any]:
    if choice is None:
        return {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    modes = {"auto": "auto", "any": "required", "none": "none"}
    if kind in modes:
        chosen: Any = modes[kind]
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chosen = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise BadRequestError("'tool_choice' must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name'}")
    parallel = {"parallel_tool_calls": False} if choice.get("disable_parallel_tool_use") else {}
    return {"tool_choice": chosen} | parallel


def _options(body: Mapping[str, Any]) -> dict[str, Any]:
    options = {key: body[key] for key in FORWARDED if body.get(key) is not None}
    tokens = options.get("max_tokens")
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1):
        raise BadRequestError("'max_tokens' must be a positive integer")
    stops = body.get("stop_sequences")
    if stops:
        if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
            raise BadRequestError("'stop_sequences' must be an array of strings")
        options["stop"] = list(stops)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequestError("'stream' must be a boolean")
    return options | ({"stream": True} if stream else {})
