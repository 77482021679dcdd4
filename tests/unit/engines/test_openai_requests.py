"""Request bodies of both OpenAI APIs normalised to the same messages and tools, and refused with the field named."""

from __future__ import annotations

from typing import Any

import pytest

from orchard.engines.exceptions import InvalidRequestError
from orchard.engines.openai_requests import chat_request, parse_body, responses_request

FUNCTION = {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object", "properties": {}}}


def test_chat_and_responses_normalise_to_the_same_conversation() -> None:
    chat = chat_request(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "now?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": FUNCTION}],
            "max_completion_tokens": 7,
            "stop": "END",
            "seed": 5,
        }
    )
    responses = responses_request(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather now?"}]},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [{"type": "function", **FUNCTION}],
            "max_output_tokens": 7,
            "stop": ["END"],
            "seed": 5,
        }
    )
    assert (
        chat.messages
        == responses.messages
        == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather now?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ]
    )
    assert chat.tools == responses.tools == [{"type": "function", "function": FUNCTION}]
    for request in (chat, responses):
        assert (request.max_tokens, request.stop, request.seed, request.parse_tools) == (7, ("END",), 5, True)
    assert (chat.temperature, chat.top_p, chat.n, chat.stream) == (1.0, 1.0, 1, False)


def test_tool_choice_none_disables_parsing() -> None:
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", **FUNCTION}], "tool_choice": "none"}
    assert responses_request(body).parse_tools is False


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"model": ""}, "model", "'model' must be a non-empty string"),
        ({"model": "m", "messages": []}, "messages", "'messages' must be a non-empty array"),
        ({"model": "m", "messages": [{"role": "bot"}]}, "messages[0].role", "messages[0].role must be one of"),
        ({"tools": {"type": "function"}}, "tools", "'tools' must be an array"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "must match"),
        ({"tools": [{"type": "function"}]}, "tools[0]", "tools[0] must be"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
            "must be a JSON Schema object",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": 1}}}}]},
            "tools[0].function.parameters",
            "properties must map names to schemas",
        ),
        ({"temperature": 2.5}, "temperature", "'temperature' must be in [0.0, 2.0], got 2.5"),
        ({"top_p": 0}, "top_p", "'top_p' must be in (0.0, 1.0], got 0"),
        ({"max_tokens": 0}, "max_tokens", "'max_tokens' must be at least 1, got 0"),
        ({"n": 2, "stream": True}, "n", "n > 1 is not supported with stream"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "'stop' must be a string or an array of at most 4 strings"),
        ({"seed": "1"}, "seed", "'seed' must be an integer"),
        ({"stream": "yes"}, "stream", "'stream' must be a boolean"),
    ],
)
def test_chat_request_errors_name_the_field(body: dict[str, Any], param: str, message: str) -> None:
    full = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    with pytest.raises(InvalidRequestError) as info:
        chat_request(full)
    assert info.value.param == param
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": 3}, "input"),
        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": "x", "instructions": 3}, "instructions"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input[0].content"),
    ],
)
def test_responses_request_errors_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        responses_request({"model": "m", **body})
    assert info.value.param == param


def test_body_must_be_a_json_object() -> None:
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        parse_body(b"{nope")
    with pytest.raises(InvalidRequestError, match="must be a JSON object"):
        parse_body(b"[1]")
