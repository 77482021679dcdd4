"""Canonical assistant turns: a re-serialised earlier turn is forwarded as the engine sampled it.

A harness re-sends its history with every call, and some re-serialise the model's earlier turns on the way: tool
arguments the model wrote as ``{"cmd": "ls"}`` come back as ``{"cmd":"ls"}`` (opencode), keys reordered, whitespace
normalised, a reasoning block dropped. The engine then renders a prompt that no longer extends the previous call's
prompt + completion, so the recorded trajectory breaks into a new conversation and the model is shown tokens it never
sampled. ``SampledTurns`` remembers, per episode, each chat answer the engine gave (its content, reasoning and tool
calls), and before a call is forwarded replaces every assistant message of its history that *means* the same as a
remembered answer with that answer (``canonicalize``), so the engine renders the turn from the text it sampled and
the prompt extends the earlier call token for token (when the engine's chat template renders its own answers back
exactly, as the ones Orchard serves do).

Two assistant messages mean the same (``turn_key``) when their content is equal once whitespace runs are collapsed and
the ends stripped, and their tool calls have the same names and ``json.loads``-equal arguments, in order; reasoning is
not compared (a harness may drop it). Only content, reasoning, and each tool call's name and arguments are replaced:
the harness's other fields (tool call ids included) are kept. A genuinely edited turn (other text, other arguments)
is left alone and, as before, starts a new conversation.

Departures: only the ``max_turns`` most recent answers are remembered. When several remembered answers mean the same
and the harness's message is none of them exactly, the most recent one is used. Responses API input items are not
canonicalised.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from producers.proxy.completion import Completion

TurnKey = tuple[str, tuple[tuple[str, str], ...]]
REASONING_FIELDS = ("reasoning_content", "reasoning")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def _arguments(raw: Any) -> str:
    """Arguments in one canonical JSON form (a string that is not JSON stands for itself, whitespace-normalised)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return " ".join(raw.split())
    return json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def turn_key(message: Mapping[str, Any]) -> TurnKey:
    """What an assistant message means, ignoring how it is serialised.

    >>> call = {"function": {"name": "sh", "arguments": '{"b": 1, "a": 2}'}}
    >>> turn_key({"content": " Look\\n around. ", "tool_calls": [call]})
    ('Look around.', (('sh', '{"a":2,"b":1}'),))
    """
    calls = tuple(
        (str((call.get("function") or {}).get("name") or ""), _arguments((call.get("function") or {}).get("arguments")))
        for call in message.get("tool_calls") or ()
        if isinstance(call, Mapping)
    )
    return " ".join(_text(message.get("content")).split()), calls


def sampled_message(completion: Completion) -> dict[str, Any]:
    """The assistant message the engine answered with, in chat form."""
    message: dict[str, Any] = {"content": completion.text or None}
    if completion.reasoning:
        message["reasoning_content"] = completion.reasoning
    if completion.tool_calls:
        message["tool_calls"] = completion.tool_calls
    return message


class SampledTurns:
    """One episode's chat answers, by what they mean, so a re-serialised history can be forwarded as sampled."""

    def __init__(self, max_turns: int = 256) -> None:
        """Remember at most ``max_turns`` answers (the most recent)."""
        self._max = max_turns
        self._turns: OrderedDict[TurnKey, list[dict[str, Any]]] = OrderedDict()

    def remember(self, completions: Sequence[Completion]) -> None:
        """Remember the answers of one chat call (each choice of an ``n > 1`` call)."""
        for completion in completions:
            message = sampled_message(completion)
            key = turn_key(message)
            forms = [form for form in self._turns.pop(key, []) if form != message]
            self._turns[key] = [*forms, message]
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)

    def canonicalize(self, messages: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """``messages`` with each re-serialised assistant turn replaced by its sampled form, and the indexes of the
        messages replaced (empty when none was: then ``messages`` is returned as it came)."""
        out, replaced = list(messages), []
        for index, message in enumerate(messages):
            canonical = self._canonical(message)
            if canonical is not None:
                out[index] = canonical
                replaced.append(index)
        return out, replaced

    def _canonical(self, message: Any) -> dict[str, Any] | None:
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            return None
        forms = self._turns.get(turn_key(message))
        if not forms or any(_as_sampled(message, form) for form in forms):
            return None
        return _substitute(message, forms[-1])


def _as_sampled(message: Mapping[str, Any], form: Mapping[str, Any]) -> bool:
    """Whether ``message`` already carries ``form``'s content, reasoning and tool calls exactly."""
    content = message.get("content")
    if not isinstance(content, str | None) or _text(content) != _text(form.get("content")):
        return False
    if form.get("reasoning_content") and not any(message.get(f) == form["reasoning_content"] for f in REASONING_FIELDS):
        return False
    return _functions(message) == _functions(form)


def _functions(message: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    functions = [call.get("function") or {} for call in message.get("tool_calls") or ()]
    return [(function.get("name"), function.get("arguments")) for function in functions]


def _substitute(message: Mapping[str, Any], form: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` with ``form``'s content, reasoning and tool call names and arguments (its other fields kept)."""
    out = {key: value for key, value in message.items() if key not in REASONING_FIELDS}
    out["content"] = form.get("content")
    if form.get("reasoning_content"):
        out["reasoning_content"] = form["reasoning_content"]
    sampled = form.get("tool_calls") or []
    if sampled:
        out["tool_calls"] = [
            {**call, "function": {**(call.get("function") or {}), **(own.get("function") or {})}}
            for call, own in zip(message.get("tool_calls") or [], sampled, strict=True)
        ]
    return out
