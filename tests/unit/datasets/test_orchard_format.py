"""The orchard layout: messages in a fixed struct without loss, loss masks and logprobs over the last sequence."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from orchard.datasets.exceptions import RowError
from orchard.datasets.orchard_format import calls_from_row, message_to_row, row_to_message, trajectory_to_row
from orchard.trajectory import Step, Trajectory

CALL = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1", "name": "shell"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": "x"}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": {}}}]},
        {"role": "assistant", "content": "hm", "reasoning_content": "think", "weight": 0},
    ],
)
def test_a_message_survives_the_fixed_struct(message: dict[str, Any]) -> None:
    row = message_to_row(message)
    assert set(row) == {"role", "content", "name", "tool_call_id", "tool_calls", "extra_json"}
    assert row_to_message(row) == {k: v for k, v in message.items() if v is not None}


def test_what_does_not_fit_the_struct_is_kept_in_extra_json() -> None:
    row = message_to_row({"role": "user", "content": [{"type": "text", "text": "a"}], "weight": 1})
    assert (row["content"], json.loads(row["extra_json"])) == (
        None,
        {"content": [{"type": "text", "text": "a"}], "weight": 1},
    )


def step(index: int, prompt: list[int], completion: list[int], conversation: int = 0, **extra: Any) -> Step:
    return Step(
        call_index=index,
        conversation_id=conversation,
        policy_version=3,
        prompt_token_ids=np.array(prompt, dtype=np.int32),
        completion_token_ids=np.array(completion, dtype=np.int32),
        completion_logprobs=np.full(len(completion), -0.5 - index, dtype=np.float32),
        request_messages=extra.get("messages", [{"role": "user", "content": "go"}]),
        response_text=f"reply {index}",
        response_tool_calls=[],
        finish_reason="stop",
    )


def test_the_loss_mask_covers_each_completion_of_the_last_sequence_with_its_logprobs() -> None:
    first = step(0, [1, 2], [3, 4])
    side = step(1, [9], [8], conversation=1, messages=[{"role": "user", "content": "summarise"}])
    last = step(
        2,
        [1, 2, 3, 4, 5],
        [6],
        messages=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "reply 0"},
            {"role": "user", "content": "more"},
        ],
    )
    trajectory = Trajectory("r", "e", "t", "g", (first, side, last), status="SUCCEEDED", reward=1.0, success=True)
    row = trajectory_to_row(trajectory, "builtin", "m", [[], [], []])
    assert row["input_ids"].tolist() == [1, 2, 3, 4, 5, 6]
    assert row["loss_mask"].tolist() == [0, 0, 1, 1, 0, 1]
    assert row["logprobs"].tolist() == [0, 0, -0.5, -0.5, 0, -2.5]
    assert [m["content"] for m in row["messages"]] == ["go", "reply 0", "more", "reply 2"]
    assert [(c["prompt_message_count"], c["request_messages_json"]) for c in row["calls"]] == [
        (1, None),
        (None, json.dumps([{"role": "user", "content": "summarise"}])),
        (3, None),
    ]


def test_a_row_that_does_not_follow_the_layout_is_a_row_error() -> None:
    with pytest.raises(RowError, match="not an orchard-layout row: KeyError"):
        calls_from_row({"messages": [], "tools_json": "[]", "calls": [{"call_index": 0}]})
    with pytest.raises(RowError, match="needs at least one call"):
        calls_from_row({"messages": [], "tools_json": "[]", "calls": []})
