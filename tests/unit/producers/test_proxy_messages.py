"""The Anthropic Messages API on the proxy: requests into chat completions, chat answers and streams back into
Messages, and errors in Anthropic's format."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic_core import from_json, to_json

from orchard.engines.token_trace import TokenTrace
from producers.proxy.completion import Completion, chat_completions
from producers.proxy.exceptions import (
    AuthenticationError,
    BackendError,
    BackendRejectedError,
    BadRequestError,
    RequestTooLargeError,
)
from producers.proxy.messages import count_tokens_body, parse_messages_request, to_chat_body
from producers.proxy.messages_reply import anthropic_error, messages_reply, stop_reason, tool_input
from producers.proxy.messages_stream import MessagesStreamAssembler
from producers.proxy.sse import SseEvent

TRACE = TokenTrace(prompt_token_ids=[1, 2, 3, 4], completion_token_ids=[7, 8], completion_logprobs=[-0.5, -0.25],
                   policy_version=3)  # fmt: skip
USAGE = {"input_tokens": 4, "output_tokens": 2, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
SHELL = {"name": "shell", "description": "Run a command.", "input_schema": {"type": "object", "properties": {}}}


def request_body(**extra: Any) -> dict[str, Any]:
    """A Messages request of one tool-using turn: system blocks, a tool result, an image, thinking, tools."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"}}
    return {
        "model": "policy",
        "max_tokens": 512,
        "system": [{"type": "text", "text": "You fix bugs.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Fix parse()."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look first.", "signature": "sig"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"cmd": "ls", "dir": "é"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Here is a screenshot."},
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}]},
                    image,
                ],
            },
        ],
        "tools": [SHELL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "temperature": 0.7,
        "top_k": 40,
        "stop_sequences": ["</answer>"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user_id": "u-1"},
        **extra,
    }


CHAT_MESSAGES = [
    {"role": "system", "content": [{"type": "text", "text": "You fix bugs."}]},
    {"role": "user", "content": "Fix parse()."},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "shell", "arguments": '{"cmd": "ls", "dir": "é"}'},
            }
        ],
        "reasoning_content": "Look first.",
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "a.py"}]},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Here is a screenshot."},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
        ],
    },
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "parameters": {"type": "object", "properties": {}},
            "description": "Run a command.",
        },
    }
]


# ------------------------------------------------------------------------------------------------ requests
def test_a_messages_request_becomes_the_equivalent_chat_completions_request() -> None:
    assert to_chat_body(request_body(stream=True)) == {
        "model": "policy",
        "messages": CHAT_MESSAGES,
        "tools": CHAT_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 512,
        "temperature": 0.7,
        "top_k": 40,
        "stop": ["</answer>"],
        "stream": True,
    }


def test_the_parsed_request_forwards_chat_and_records_the_harness_options() -> None:
    request = parse_messages_request(to_json(request_body()))
    assert from_json(request.raw) == to_chat_body(request_body())
    assert (request.flavour, request.recorded_flavour, request.path) == ("MESSAGES", "CHAT", "/chat/completions")
    assert (request.model, request.messages, request.tools) == ("policy", CHAT_MESSAGES, CHAT_TOOLS)
    assert (request.stream, request.choices, request.stop_sequences) == (False, 1, ("</answer>",))
    assert request.sampling == {
        "max_tokens": 512,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "temperature": 0.7,
        "top_k": 40,
        "stop_sequences": ["</answer>"],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "tool", "name": "shell"}, {"tool_choice": {"type": "function", "function": {"name": "shell"}}}),
    ],
)
def test_tool_choices(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    body = to_chat_body({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": choice})
    assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}], **expected}


def test_plain_strings_stay_strings_and_tool_only_turns_have_no_content() -> None:
    body = {
        "model": "m",
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "ls", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "x"}]},
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "..."}, {"type": "text", "text": "ok"}],
            },
        ],
    }
    assert to_chat_body(body)["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "x"},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip


def test_count_tokens_bodies_need_no_max_tokens_and_never_stream() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert from_json(count_tokens_body(to_json(body))) == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": ""}, "'model' is required"),
        ({"messages": []}, "'messages' is required"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role must be 'user' or 'assistant'"),
        ({"messages": [{"role": "user", "content": 3}]}, "must be a string or an array of content blocks"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "type 'video' are not supported"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"max_tokens": 0}, "'max_tokens' must be a positive integer"),
        ({"stop_sequences": "END"}, "'stop_sequences' must be an array of strings"),
        ({"tool_choice": {"type": "sometimes"}}, "'tool_choice' must be"),
        ({"system": [{"type": "image"}]}, "'system' must be a string or an array of text blocks"),
    ],
)
def test_bad_requests_name_what_is_wrong(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        parse_messages_request(to_json(request_body() | changes))


# ------------------------------------------------------------------------------------------------ answers
def chat_answer(message: dict[str, Any], finish: str, **choice: Any) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "orchard": TRACE.model_dump(),
    }


def test_a_chat_answer_becomes_a_message_with_the_engines_token_counts() -> None:
    call = {"id": "call_0_0", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}
    body = chat_answer({"role": "assistant", "content": "Looking.", "tool_calls": [call], "reasoning_content": "hmm"},
                       "tool_calls")  # fmt: skip
    request = parse_messages_request(to_json(request_body()))
    reply = messages_reply(body, chat_completions(body)[0], request)
    assert reply["id"].startswith("msg_")
    assert {key: value for key, value in reply.items() if key != "id"} == {
        "type": "message",
        "role": "assistant",
        "model": "policy",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "call_0_0", "name": "shell", "input": {"cmd": "ls"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 4,
            "output_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def test_stop_reasons() -> None:
    assert [stop_reason(finish, backend, ["END"]) for finish, backend in [
        ("stop", None), ("stop", "END"), ("stop", "OTHER"), ("stop", 2), ("length", None), ("tool_calls", "END"),
        ("content_filter", None),
    ]] == [
        ("end_turn", None), ("stop_sequence", "END"), ("end_turn", None), ("end_turn", None), ("max_tokens", None),
        ("tool_use", None), ("refusal", None),
    ]  # fmt: skip
    assert (tool_input('{"a": [1]}'), tool_input(""), tool_input("{broken")) == ({"a": [1]}, {}, {})


def test_proxy_errors_in_anthropics_format() -> None:
    rejected = BackendRejectedError(429, {"error": {"message": "slow down", "type": "rate_limit_error"}})
    cases = [AuthenticationError("no key"), BadRequestError("bad"), RequestTooLargeError("big"), rejected,
             BackendError("engine died")]  # fmt: skip
    assert [(exc.status, anthropic_error(exc)) for exc in cases] == [
        (401, {"type": "error", "error": {"type": "authentication_error", "message": "no key"}}),
        (400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
        (413, {"type": "error", "error": {"type": "request_too_large", "message": "big"}}),
        (429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}),
        (502, {"type": "error", "error": {"type": "api_error", "message": "engine died"}}),
    ]


# ------------------------------------------------------------------------------------------------ streams
def chunk(delta: dict[str, Any], finish: str | None = None, stop: str | None = None, **extra: Any) -> SseEvent:
    """A chat chunk (``stop``: the matched stop string, as vLLM reports it in the choice)."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish} | ({"stop_reason": stop} if stop else {})
    data = {"id": "x", "object": "chat.completion.chunk", "choices": [choice]}
    return SseEvent.parse(f"data: {json.dumps(data | extra)}")


def events_of(raw: bytes) -> list[dict[str, Any]]:
    """The events of a Messages stream, each checked to be named by its type."""
    events = []
    for block in raw.decode().strip().split("\n\n"):
        name, data = (line.partition(": ")[2] for line in block.split("\n"))
        event = json.loads(data)
        assert event["type"] == name
        events.append(event)
    return events


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    SseEvent.parse(": keep-alive"),
    chunk({"reasoning_content": "Think"}),
    chunk({"content": "Look"}),
    chunk({"content": "ing."}),
    chunk(
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "ls", "arguments": ""}}]}
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"p": '}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"."}'}}]}),
    chunk(
        {
            "tool_calls": [
                {"index": 1, "id": "call_b", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
            ]
        }
    ),
    chunk({}, "tool_calls", orchard=TRACE.model_dump()),
    SseEvent.parse("data: [DONE]"),
]


def test_a_chat_stream_becomes_a_well_formed_messages_stream() -> None:
    assembler = MessagesStreamAssembler("policy")
    events = events_of(b"".join(assembler.feed(event) for event in STREAM))
    start = {"type": "message_start", "message": {
        "id": assembler.id, "type": "message", "role": "assistant", "model": "policy", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0},
    }}  # fmt: skip
    assert events == [
        start,
        {"type": "ping"},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Think"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Look"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ing."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2,
         "content_block": {"type": "tool_use", "id": "call_a", "name": "ls", "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"p": '}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '"."}'}},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3,
         "content_block": {"type": "tool_use", "id": "call_b", "name": "cat", "input": {}}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "content_block_stop", "index": 3},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": USAGE},
        {"type": "message_stop"},
    ]  # fmt: skip
    assert assembler.finish() == b""  # closed once
    assert assembler.completions() == [
        Completion(
            "Looking.",
            [
                {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": '{"p": "."}'}},
                {"id": "call_b", "type": "function", "function": {"name": "cat", "arguments": "{}"}},
            ],
            "tool_calls",
            TRACE,
            reasoning="Think",
        )
    ]


def test_a_stream_ending_without_done_is_closed_by_finish_and_stop_sequences_are_named() -> None:
    assembler = MessagesStreamAssembler("policy", ["END"])
    raw = b"".join(assembler.feed(e) for e in [chunk({"content": "hi"}), chunk({}, "stop", orchard=TRACE.model_dump())])
    last = events_of(raw + assembler.finish())[-2:]
    assert last[0]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert last[1] == {"type": "message_stop"}
    named = MessagesStreamAssembler("policy", ["END"])
    named.feed(chunk({}, "stop", stop="END", orchard=TRACE.model_dump()))
    assert events_of(named.finish())[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stream_errors_become_error_events_that_end_the_stream() -> None:
    assembler = MessagesStreamAssembler("policy")
    raw = assembler.feed(chunk({"content": "hi"}))
    raw += assembler.feed(SseEvent.parse('data: {"error": {"message": "engine died"}}'))
    raw += assembler.feed(SseEvent.parse("data: [DONE]"))
    assert assembler.backend_failed
    events = events_of(raw)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "the backend failed: engine died"}}
    assert [e["type"] for e in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    timed_out = MessagesStreamAssembler("policy")
    assert events_of(timed_out.error_event(BackendError("too slow"))) == [
        {"type": "error", "error": {"type": "api_error", "message": "too slow"}}
    ]
    assert timed_out.finish() == b""
    with pytest.raises(BackendError, match="without a token trace"):
        MessagesStreamAssembler("policy").feed(SseEvent.parse("data: [DONE]"))
