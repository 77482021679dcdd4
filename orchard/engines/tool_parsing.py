"""Tool calls in model output: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Hermes/Qwen style).

``parse_tool_calls`` splits a completion's text into the assistant's content and its tool calls:

- the content is the text before the first ``<tool_call>``, plus any text between or after the blocks; ``None``
  when that is only whitespace and there are tool calls;
- each block must hold a JSON object with a string ``name`` and an ``arguments`` object (or a JSON string of one;
  missing means ``{}``); arguments are re-serialised with ``json.dumps`` (``", "``/``": "`` separators), the form the
  tiny chat template renders back, so a parsed call re-renders token for token when the model wrote it that way;
- if any block is unterminated or malformed, there are no tool calls and the whole text is the content: the client
  sees what the model said rather than a guess (the token trace is unaffected either way).

``ToolCallStreamFilter`` decides, while text streams, which part may already be sent as content: text before the
first ``<tool_call>`` (holding back a suffix that may be the start of one, and leading whitespace), so what it
releases is always a prefix of the final content.

>>> parse_tool_calls('<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>')
ParsedOutput(content=None, tool_calls=(ParsedToolCall(name='ls', arguments='{"path": "."}'),))
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call: the function's name and its arguments as a JSON object string."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A completion split into content and tool calls."""

    content: str | None
    tool_calls: tuple[ParsedToolCall, ...] = ()


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split ``text`` into content and tool calls; see the module docstring for the rules."""
    first = text.find(TOOL_CALL_START)
    if first < 0:
        return ParsedOutput(text)
    pieces, calls, pos = [text[:first]], [], first
    while (start := text.find(TOOL_CALL_START, pos)) >= 0:
        end = text.find(TOOL_CALL_END, start)
        call = _parse_block(text[start + len(TOOL_CALL_START) : end]) if end >= 0 else None
        if call is None:
            return ParsedOutput(text)
        pieces.append(text[pos:start])
        calls.append(call)
        pos = end + len(TOOL_CALL_END)
    pieces.append(text[pos:])
    content = "".join(pieces)
    return ParsedOutput(content if content.strip() else None, tuple(calls))


def _parse_block(body: str) -> ParsedToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _partial_marker(text: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``<tool_call>``."""
    for size in range(min(len(text), len(TOOL_CALL_START) - 1), 0, -1):
        if TOOL_CALL_START.startswith(text[-size:]):
            return size
    return 0


class ToolCallStreamFilter:
    """Releases streamed text as content only while it cannot belong to a tool call."""

    def __init__(self) -> None:
        self._text = ""
        self._released = 0
        self._in_calls = False

    def push(self, delta: str) -> str:
        """Add streamed text; return the content that may be sent now."""
        self._text += delta
        if self._in_calls:
            return ""
        first = self._text.find(TOOL_CALL_START)
        if first >= 0:
            self._in_calls = True
            safe = self._text[:first]
        else:
            safe = self._text[: len(self._text) - _partial_marker(self._text)]
        if not safe.strip():
            return ""
        piece = safe[self._released :]
        self._released = len(safe)
        return piece

    def finish(self, content: str | None) -> str:
        """The rest of the final ``content`` (from ``parse_tool_calls``) not yet released."""
        return (content or "")[self._released :]
