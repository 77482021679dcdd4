"""Canonical assistant turns (``producers.proxy.canonical``): which re-serialised turns are recognised, and what is
forwarded in their place."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchard.engines.token_trace import TokenTrace
from producers.proxy.canonical import SampledTurns, turn_key
from producers.proxy.completion import Completion

TRACE = TokenTrace(prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[0.0], policy_version=0)
SPACED = '{"cmd": "ls -la", "cwd": "/src"}'


def call(arguments: str, call_id: str = "call_0", name: str = "shell") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: Any, *calls: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **({"tool_calls": list(calls)} if calls else {}), **extra}


def remembered(text: str = "Looking around.", arguments: str = SPACED, reasoning: str | None = None) -> SampledTurns:
    turns = SampledTurns()
    turns.remember([Completion(text, [call(arguments)], "tool_calls", TRACE, reasoning)])
    return turns


SAMPLED = assistant("Looking around.", call(SPACED))
HISTORY = [{"role": "user", "content": "Fix"}]
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": "a.py"}


@pytest.mark.parametrize(
    "harness_turn",
    [
        assistant("Looking around.", call('{"cmd":"ls -la","cwd":"/src"}')),  # compact
        assistant("Looking around.", call(json.dumps({"cwd": "/src", "cmd": "ls -la"}, indent=2))),  # reordered
        assistant("  Looking\n around.\n", call(SPACED)),  # whitespace
        assistant([{"type": "text", "text": "Looking around."}], call(SPACED)),  # content as parts
    ],
    ids=["compact", "reordered", "whitespace", "parts"],
)
def test_a_re_serialised_turn_is_forwarded_as_sampled(harness_turn: dict[str, Any]) -> None:
    messages, replaced = remembered().canonicalize([*HISTORY, harness_turn, RESULT])
    assert (messages, replaced) == ([*HISTORY, SAMPLED, RESULT], [1])


def test_a_dropped_reasoning_block_is_put_back_and_the_harness_fields_are_kept() -> None:
    turns = remembered(reasoning="Files first.")
    harness_turn = assistant("Looking around.", call('{"cmd":"ls -la","cwd":"/src"}', "toolu_9"), name="agent")
    messages, replaced = turns.canonicalize([harness_turn])
    expected = assistant("Looking around.", call(SPACED, "toolu_9"), name="agent", reasoning_content="Files first.")
    assert (messages, replaced) == ([expected], [0])


@pytest.mark.parametrize(
    "harness_turn",
    [
        SAMPLED,  # already as sampled
        assistant("I looked around.", call(SPACED)),  # edited text
        assistant("Looking around.", call('{"cmd": "ls", "cwd": "/src"}')),  # edited arguments
        assistant("Looking around.", call(SPACED, name="bash")),  # another tool
        assistant("Looking around.", call(SPACED), call("{}")),  # one more call
        {"role": "user", "content": "Looking around."},  # not an assistant turn
    ],
    ids=["as-sampled", "edited-text", "edited-arguments", "other-tool", "more-calls", "user"],
)
def test_a_turn_that_is_not_a_re_serialised_answer_is_left_alone(harness_turn: dict[str, Any]) -> None:
    messages = [*HISTORY, harness_turn]
    assert remembered().canonicalize(messages) == (messages, [])


def test_of_several_answers_meaning_the_same_the_exact_one_or_the_latest_is_used() -> None:
    turns = SampledTurns()
    for arguments in ('{"a": 1}', '{"a":1}'):
        turns.remember([Completion("", [call(arguments)], "tool_calls", TRACE)])
    assert turns.canonicalize([assistant(None, call('{"a": 1}'))])[1] == []  # exactly one of them
    latest = assistant(None, call('{"a":1}'))
    assert turns.canonicalize([assistant(None, call('{ "a" : 1 }'))]) == ([latest], [0])


def test_only_the_most_recent_answers_are_remembered() -> None:
    turns = SampledTurns(max_turns=2)
    for n in range(3):
        turns.remember([Completion(f"step {n}", [call(f'{{"n": {n}}}')], "tool_calls", TRACE)])
    reserialised = [assistant(f"step {n}", call(f'{{"n":{n}}}')) for n in range(3)]
    assert turns.canonicalize(reserialised)[1] == [1, 2]


def test_turn_key_ignores_serialisation_only() -> None:
    assert turn_key(assistant(" a  b ", call('{"x": [1, 2]}'))) == turn_key(assistant("a b", call('{"x":[1,2]}')))
    assert turn_key(assistant("a", call("not json  at all"))) == ("a", (("shell", "not json at all"),))
    assert turn_key(assistant("a", call('{"x": 1}'))) != turn_key(assistant("a", call('{"x": 2}')))
