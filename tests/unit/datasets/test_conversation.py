"""Conversations split into model calls, tokenized with the tiny tokenizer's chat template as the engine would."""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np
import pytest

from orchard.datasets.conversation import ChatTokenizer
from orchard.datasets.exceptions import DatasetError, RowError
from orchard.engines.tiny import build_tiny_tokenizer

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You fix bugs."},
    {"role": "user", "content": "The test fails."},
    {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"},
    {"role": "assistant", "content": "Fixed the loop in a.py."},
]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def chat(hf_tokenizer: Any) -> ChatTokenizer:
    return ChatTokenizer(hf_tokenizer, "tiny")


def engine_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """What ``LocalEngine.render_prompt`` sends to the model for ``messages``."""
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_each_assistant_message_is_one_call_with_the_prompt_the_engine_would_see(
    chat: ChatTokenizer, hf_tokenizer: Any
) -> None:
    calls = chat.split(MESSAGES, TOOLS)
    assert [c.messages for c in calls] == [MESSAGES[:2], MESSAGES[:4]]
    assert [c.prompt_ids.tolist() for c in calls] == [engine_prompt(hf_tokenizer, MESSAGES[:i]) for i in (2, 4)]
    assert [hf_tokenizer.decode(c.completion_ids) for c in calls] == [
        'Let me look.<tool_call>{"name": "shell", "arguments": {"command": "ls"}}</tool_call><|im_end|>',
        "Fixed the loop in a.py.<|im_end|>",
    ]
    assert [(c.response_text, c.tool_calls) for c in calls] == [
        ("Let me look.", [CALL]),
        ("Fixed the loop in a.py.", []),
    ]


def test_the_next_prompt_continues_the_previous_prompt_and_completion_token_for_token(chat: ChatTokenizer) -> None:
    first, second = chat.split(MESSAGES, TOOLS)
    sequence = np.concatenate([first.prompt_ids, first.completion_ids])
    assert np.array_equal(second.prompt_ids[: len(sequence)], sequence)


def test_piecewise_encoding_equals_whole_encoding_on_a_long_conversation(chat: ChatTokenizer) -> None:
    messages = copy.deepcopy(MESSAGES[:2])
    for turn in range(12):
        messages.append({"role": "assistant", "content": f"Step {turn}: run the tests again.", "tool_calls": [CALL]})
        messages.append({"role": "tool", "tool_call_id": "c1", "content": "FAILED tests/test_parse.py " * 5})
    messages.append({"role": "assistant", "content": "All tests pass."})
    calls = chat.split(messages, TOOLS)
    assert chat.segmented
    wanted = [
        chat.encode(chat.render(messages[:i], TOOLS, True)) for i, m in enumerate(messages) if m["role"] == "assistant"
    ]
    assert [c.prompt_ids.tolist() for c in calls] == wanted


def test_a_tokenizer_that_does_not_encode_pieces_independently_is_encoded_whole(chat: ChatTokenizer) -> None:
    chat._cut = re.compile("e")  # cuts inside words: pieces no longer encode like the whole text
    calls = chat.split(MESSAGES, TOOLS)
    assert not chat.segmented
    assert [c.prompt_ids.tolist() for c in calls] == [
        chat.encode(chat.render(MESSAGES[:i], TOOLS, True)) for i in (2, 4)
    ]


def test_a_template_that_rewrites_the_assistant_turn_is_a_row_error(hf_tokenizer: Any) -> None:
    tokenizer = copy.copy(hf_tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant (thinking):{% endif %}"
    )
    with pytest.raises(RowError, match="message 2: the chat template does not render the assistant turn"):
        ChatTokenizer(tokenizer, "odd").split(MESSAGES)


def test_a_conversation_without_an_assistant_turn_is_a_row_error(chat: ChatTokenizer) -> None:
    with pytest.raises(RowError, match="no assistant message"):
        chat.split(MESSAGES[:2])


def test_a_tokenizer_without_a_chat_template_is_refused(hf_tokenizer: Any) -> None:
    tokenizer = copy.copy(hf_tokenizer)
    tokenizer.chat_template = None
    with pytest.raises(DatasetError, match="has no chat template"):
        ChatTokenizer(tokenizer, "bare")


def test_loading_names_a_path_that_is_not_a_tokenizer(tmp_path: Any) -> None:
    with pytest.raises(DatasetError, match="not 'tiny' and not a tokenizer directory"):
        ChatTokenizer.load(str(tmp_path / "missing"))
