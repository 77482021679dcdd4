"""The ``orchard`` dataset layout: one row per episode, written by ``orchard export`` and read back by the importer.

Columns (Parquet types; JSONL rows hold the same keys, ``null`` message fields left out):

| column | type | meaning |
|---|---|---|
| run_id, episode_id, task_id, group_id | string | identity of the episode |
| harness, model | string | harness and model of its last call |
| messages | list<struct> | OpenAI chat messages: the last call's request plus its reply (see ``MESSAGE_TYPE``) |
| tools_json | string | the last call's tool definitions, a JSON array |
| input_ids | list<int32> | the last call's whole sequence (prompt + completion) |
| loss_mask | list<int8> | 1 on the tokens a call of that sequence generated, 0 elsewhere |
| logprobs | list<float32> | sampling logprob of each masked token; 0 elsewhere and for retokenized calls |
| calls | list<struct> | every call in order, token-exact (see ``CALL_TYPE``) |
| status, reward, success | string, double, bool | the outcome |
| signals | list<struct<name, value>> | the grader's named signals, sorted by name |
| policy_version | int64 (nullable) | the outcome's policy version |
| num_calls | int32 | number of calls |

A message is ``{role, content, name, tool_call_id, tool_calls, extra_json}``: ``content`` a string (or null),
``tool_calls`` the OpenAI list of ``{id, type, function: {name, arguments}}``; whatever does not fit these types
(content parts, non-string arguments, other keys) is kept in ``extra_json`` so nothing is lost. A call's request is
``messages[:prompt_message_count]`` unless ``request_messages_json`` holds it (a call of another conversation),
and its tools are ``tools_json`` unless ``request_tools_json`` holds them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from orchard.datasets.exceptions import RowError
from orchard.prefix_delta import assistant_message
from orchard.trajectory import Step, Trajectory

FUNCTION_TYPE = pa.struct([("name", pa.string()), ("arguments", pa.string())])
TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", FUNCTION_TYPE)])
MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("name", pa.string()),
        ("tool_call_id", pa.string()),
        ("tool_calls", pa.list_(TOOL_CALL_TYPE)),
        ("extra_json", pa.string()),
    ]
)
CALL_TYPE = pa.struct(
    [
        ("call_index", pa.int32()),
        ("conversation_id", pa.int32()),
        ("policy_version", pa.int64()),
        ("prompt_message_count", pa.int32()),
        ("request_messages_json", pa.string()),
        ("request_tools_json", pa.string()),
        ("response_text", pa.string()),
        ("response_tool_calls_json", pa.string()),
        ("finish_reason", pa.string()),
        ("retokenized", pa.bool_()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("completion_token_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
    ]
)
SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("episode_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("harness", pa.string()),
        ("model", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("tools_json", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("calls", pa.list_(CALL_TYPE)),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("success", pa.bool_()),
        ("signals", pa.list_(pa.struct([("name", pa.string()), ("value", pa.float64())]))),
        ("policy_version", pa.int64()),
        ("num_calls", pa.int32()),
    ]
)
"""The Parquet schema of the ``orchard`` layout."""
_PLAIN_KEYS = ("role", "content", "name", "tool_call_id")


def message_to_row(message: Mapping[str, Any]) -> dict[str, Any]:
    """A chat message in the fixed ``MESSAGE_TYPE`` shape; what does not fit goes to ``extra_json``."""
    row: dict[str, Any] = dict.fromkeys(_PLAIN_KEYS + ("tool_calls", "extra_json"))
    extra: dict[str, Any] = {}
    for key, value in message.items():
        if key in _PLAIN_KEYS and (value is None or isinstance(value, str)):
            row[key] = value
        elif key == "tool_calls" and _plain_tool_calls(value):
            row[key] = [{"id": c["id"], "type": c["type"], "function": dict(c["function"])} for c in value]
        else:
            extra[key] = value
    if extra:
        row["extra_json"] = json.dumps(extra, sort_keys=True)
    return row


def row_to_message(row: Mapping[str, Any]) -> dict[str, Any]:
    """The chat message a ``MESSAGE_TYPE`` row holds (its null fields left out)."""
    message = {key: row[key] for key in _PLAIN_KEYS + ("tool_calls",) if row.get(key) is not None}
    if message.get("tool_calls") is not None:
        message["tool_calls"] = [
            {"id": c["id"], "type": c["type"], "function": dict(c["function"])} for c in message["tool_calls"]
        ]
    if row.get("extra_json"):
        message.update(json.loads(row["extra_json"]))
    return message


def _plain_tool_calls(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    for call in value:
        function = call.get("function") if isinstance(call, Mapping) else None
        if (
            set(call) != {"id", "type", "function"}
            or not isinstance(function, Mapping)
            or set(function) != {"name", "arguments"}
            or not all(isinstance(v, str) for v in (call["id"], call["type"], *function.values()))
        ):
            return False
    return True


def trajectory_to_row(
    trajectory: Trajectory, harness: str, model: str, call_tools: Sequence[Sequence[Any]]
) -> dict[str, Any]:
    """One export row for ``trajectory``; ``call_tools`` are the tool definitions of each step, in step order."""
    steps = trajectory.steps
    last, tools = steps[-1], list(call_tools[-1])
    conversation = [*last.request_messages, assistant_message(last.response_text, last.response_tool_calls)]
    input_ids, loss_mask, logprobs = _last_sequence(steps)
    return {
        "run_id": trajectory.run_id,
        "episode_id": trajectory.episode_id,
        "task_id": trajectory.task_id,
        "group_id": trajectory.group_id,
        "harness": harness,
        "model": model,
        "messages": [message_to_row(m) for m in conversation],
        "tools_json": json.dumps(tools),
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "calls": [_call_row(s, conversation, t, tools) for s, t in zip(steps, call_tools, strict=True)],
        "status": trajectory.status,
        "reward": trajectory.reward,
        "success": trajectory.success,
        "signals": [{"name": k, "value": float(v)} for k, v in sorted(trajectory.signals.items())],
        "policy_version": trajectory.policy_version,
        "num_calls": len(steps),
    }


def _call_row(step: Step, conversation: list[Any], tool_list: Sequence[Any], tools: list[Any]) -> dict[str, Any]:
    request, count = step.request_messages, len(step.request_messages)
    in_conversation = conversation[:count] == request
    return {
        "call_index": step.call_index,
        "conversation_id": step.conversation_id,
        "policy_version": step.policy_version,
        "prompt_message_count": count if in_conversation else None,
        "request_messages_json": None if in_conversation else json.dumps(request),
        "request_tools_json": None if list(tool_list) == tools else json.dumps(list(tool_list)),
        "response_text": step.response_text,
        "response_tool_calls_json": json.dumps(step.response_tool_calls),
        "finish_reason": step.finish_reason,
        "retokenized": step.retokenized,
        "prompt_token_ids": step.prompt_token_ids,
        "completion_token_ids": step.completion_token_ids,
        "logprobs": step.completion_logprobs,
    }


def _last_sequence(steps: Sequence[Step]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    last = steps[-1]
    sequence = last.sequence
    mask = np.zeros(len(sequence), dtype=np.int8)
    logprobs = np.zeros(len(sequence), dtype=np.float32)
    for step in steps:
        if step.conversation_id != last.conversation_id:
            continue
        start, end = len(step.prompt_token_ids), len(step.prompt_token_ids) + len(step.completion_token_ids)
        if end > len(sequence) or not np.array_equal(sequence[:end], step.sequence):
            continue
        mask[start:end] = 1
        if len(step.completion_logprobs) == end - start and not step.retokenized:
            logprobs[start:end] = step.completion_logprobs
    return sequence, mask, logprobs


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One call of an ``orchard`` row, ready for ``EpisodeRecorder.record_call``."""

    messages: list[Any]
    tools: list[Any]
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    response_text: str
    tool_calls: list[Any]
    policy_version: int
    conversation_id: int
    finish_reason: str
    retokenized: bool


def calls_from_row(row: Mapping[str, Any]) -> list[RecordedCall]:
    """The calls of an ``orchard`` row; raise ``RowError`` for a row that does not follow the layout."""
    try:
        conversation = [row_to_message(m) for m in row["messages"]]
        tools = json.loads(row["tools_json"])
        calls = []
        for call in row["calls"]:
            count, request_json = call["prompt_message_count"], call["request_messages_json"]
            messages = json.loads(request_json) if request_json is not None else conversation[:count]
            request_tools = call["request_tools_json"]
            calls.append(
                RecordedCall(
                    messages=messages,
                    tools=tools if request_tools is None else json.loads(request_tools),
                    prompt_ids=np.asarray(call["prompt_token_ids"], dtype=np.int32),
                    completion_ids=np.asarray(call["completion_token_ids"], dtype=np.int32),
                    logprobs=np.asarray(call["logprobs"], dtype=np.float32),
                    response_text=call["response_text"],
                    tool_calls=json.loads(call["response_tool_calls_json"]),
                    policy_version=int(call["policy_version"]),
                    conversation_id=int(call["conversation_id"]),
                    finish_reason=call["finish_reason"],
                    retokenized=bool(call["retokenized"]),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RowError(f"not an orchard-layout row: {type(exc).__name__}: {exc}", "MalformedRowError") from exc
    if not calls:
        raise RowError("an orchard-layout row needs at least one call", "MalformedRowError")
    return calls
