"""The vLLM backend's request/response mapping, on vLLM answers written from vLLM's protocol (no vLLM needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from orchard.engines.exceptions import GenerationFailedError
from orchard.engines.openai_requests import chat_request, responses_request
from orchard.engines.token_trace import TokenTrace, trace_of
from orchard.engines.vllm_mapping import ChatStreamMapper, VLLMProtocolError, chat_completion, vllm_chat_body
from orchard.engines.vllm_responses import ResponseStreamMapper, response_from_chat

_spec = importlib.util.spec_from_file_location("vllm_fixtures", Path(__file__).with_name("vllm_fixtures.py"))
assert _spec is not None and _spec.loader is not None
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
MESSAGES = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
HELLO_TRACE = TokenTrace(
    prompt_token_ids=fx.PROMPT_IDS, completion_token_ids=fx.HELLO_IDS, completion_logprobs=fx.HELLO_LOGPROBS,
    policy_version=3,
)  # fmt: skip
TOOL_TRACE = TokenTrace(
    prompt_token_ids=fx.PROMPT_IDS, completion_token_ids=fx.TOOL_IDS, completion_logprobs=fx.TOOL_LOGPROBS,
    policy_version=3,
)  # fmt: skip


def chat(**extra: Any) -> Any:
    return chat_request({"model": "policy", "messages": MESSAGES} | extra)


# ---------------------------------------------------------------------------------------------------- requests
def test_chat_request_asks_vllm_for_token_ids_and_raw_logprobs_with_every_sampling_parameter() -> None:
    request = chat(
        tools=TOOLS, tool_choice="auto", n=2, temperature=0.7, top_p=0.9, stop=["</s>", "\n\n"], seed=11,
        max_completion_tokens=64,
    )  # fmt: skip
    assert vllm_chat_body(request, "qwen-small") == {
        "model": "qwen-small",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
        "n": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "stream": False,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "max_completion_tokens": 64,
        "stop": ["</s>", "\n\n"],
        "seed": 11,
        "tools": TOOLS,
        "tool_choice": "auto",
    }


def test_streamed_request_always_asks_vllm_for_usage_and_defaults_apply() -> None:
    body = vllm_chat_body(chat(stream=True), "qwen-small", default_max_tokens=256)
    assert (body["stream"], body["stream_options"], body["max_completion_tokens"]) == (
        True,
        {"include_usage": True},
        256,
    )
    assert (body["temperature"], body["top_p"], "seed" in body, "stop" in body, "tools" in body) == (
        1.0,
        1.0,
        False,
        False,
        False,
    )


def test_responses_request_becomes_one_chat_choice_with_the_chat_shape_of_tools_and_tool_choice() -> None:
    request = responses_request(
        {
            "model": "policy",
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 32,
        }
    )
    body = vllm_chat_body(request, "qwen-small")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    assert (body["n"], body["max_completion_tokens"], body["tool_choice"]) == (
        1,
        32,
        {"type": "function", "function": {"name": "get_weather"}},
    )
    assert body["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]


def test_without_a_tool_parser_auto_tool_choice_renders_tools_but_asks_for_no_parsing() -> None:
    assert vllm_chat_body(chat(tools=TOOLS), "m", parse_tools=False)["tool_choice"] == "none"
    assert vllm_chat_body(chat(tools=TOOLS, tool_choice="required"), "m", parse_tools=False)["tool_choice"] == (
        "required"
    )


# ---------------------------------------------------------------------------------------------------- answers
def test_text_answer_maps_to_the_local_engines_chat_completion_with_the_trace() -> None:
    assert chat_completion(fx.hello_response(), chat(), 3) == {
        "id": "chatcmpl-8b1f0c2e7d3a4f5b9c6e1d2a3b4c5d6e",
        "object": "chat.completion",
        "created": 1761000000,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there!"},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
        "orchard": HELLO_TRACE.model_dump(),
    }


def test_several_choices_each_carry_their_own_trace_and_none_is_top_level() -> None:
    mapped = chat_completion(fx.hello_response(n=2), chat(n=2), 3)
    assert [trace_of(c) for c in mapped["choices"]] == [HELLO_TRACE, HELLO_TRACE]
    assert (trace_of(mapped), mapped["usage"]["completion_tokens"]) == (None, 8)


def test_tool_call_answer_keeps_vllms_parsed_call_and_says_tool_calls() -> None:
    mapped = chat_completion(fx.tool_response(), chat(tools=TOOLS), 3)
    call = {
        "id": fx.TOOL_CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert mapped["choices"][0]["message"] == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert (mapped["choices"][0]["finish_reason"], trace_of(mapped)) == ("tool_calls", TOOL_TRACE)


def test_length_finish_reason_passes_through() -> None:
    raw = fx.hello_response()
    raw["choices"][0]["finish_reason"] = "length"
    assert chat_completion(raw, chat(max_tokens=4), 3)["choices"][0]["finish_reason"] == "length"


def test_token_ids_are_read_from_token_id_strings_when_vllm_omits_them() -> None:
    raw = fx.hello_response()
    del raw["choices"][0]["token_ids"]
    assert trace_of(chat_completion(raw, chat(), 3)) == HELLO_TRACE


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda r: r.pop("prompt_token_ids"), "vLLM >= 0.10.2"),
        (lambda r: r["choices"][0]["token_ids"].__setitem__(1, 5), "disagree"),
        (lambda r: r["choices"][0]["logprobs"]["content"].pop(), "logprobs for 4 tokens"),
        (lambda r: r["choices"][0].update(logprobs=None, token_ids=None), "neither token_ids nor logprobs"),
        (lambda r: r.update(choices=[]), "without choices"),
    ],
)
def test_an_answer_that_cannot_be_traced_is_refused(damage: Any, message: str) -> None:
    raw = fx.hello_response()
    damage(raw)
    with pytest.raises(VLLMProtocolError, match=message):
        chat_completion(raw, chat(), 3)


# ---------------------------------------------------------------------------------------------------- streams
def stream_chat(chunks: list[dict[str, Any]], **extra: Any) -> list[dict[str, Any]]:
    mapper = ChatStreamMapper(chat(stream=True, **extra), 3)
    out = [c for chunk in chunks for c in mapper.push(chunk)]
    return out + mapper.finish()


def test_streamed_text_adds_up_to_the_unstreamed_answer_and_the_last_chunk_carries_the_same_trace() -> None:
    chunks = stream_chat(fx.hello_stream())
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert (text, chunks[0]["choices"][0]["delta"]) == ("Hello there!", {"role": "assistant", "content": ""})
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, None, "stop"]
    assert [trace_of(c) for c in chunks] == [None] * 4 + [HELLO_TRACE]
    assert {c["model"] for c in chunks} == {"policy"}
    assert all(set(c["choices"][0]) == {"index", "delta", "finish_reason", "logprobs"} for c in chunks)


def test_with_include_usage_the_usage_chunk_comes_last_and_carries_the_trace() -> None:
    chunks = stream_chat(fx.hello_stream(), stream_options={"include_usage": True})
    assert (chunks[-2]["choices"][0]["finish_reason"], trace_of(chunks[-2])) == ("stop", None)
    assert (chunks[-1]["choices"], chunks[-1]["usage"], trace_of(chunks[-1])) == (
        [],
        {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
        HELLO_TRACE,
    )


def test_streamed_tool_call_arrives_in_pieces_and_the_trace_counts_the_held_back_tokens() -> None:
    chunks = stream_chat(fx.tool_stream(), tools=TOOLS)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert calls[0] == {"index": 0, "id": fx.TOOL_CALL_ID, "type": "function", "function": {"name": "get_weather"}}
    assert "".join(c["function"].get("arguments", "") for c in calls) == '{"city": "Paris"}'
    assert (chunks[-1]["choices"][0]["finish_reason"], trace_of(chunks[-1])) == ("tool_calls", TOOL_TRACE)
    assert not any(c["choices"][0]["delta"] == {} for c in chunks[:-1])  # held-back tokens send no empty delta


def test_a_stream_cut_before_its_finish_reason_is_refused() -> None:
    mapper = ChatStreamMapper(chat(stream=True), 3)
    for chunk in fx.hello_stream()[:3]:
        mapper.push(chunk)
    with pytest.raises(VLLMProtocolError, match="before a finish reason"):
        mapper.finish()


def test_an_error_chunk_from_vllm_fails_the_stream() -> None:
    mapper = ChatStreamMapper(chat(stream=True), 3)
    mapper.push(fx.hello_stream()[0])
    error = {"error": {"message": "EngineCore died", "type": "InternalServerError", "param": None, "code": 500}}
    with pytest.raises(GenerationFailedError, match="EngineCore died"):
        mapper.push(error)


# ---------------------------------------------------------------------------------------------------- responses
def responses(**extra: Any) -> Any:
    return responses_request({"model": "policy", "input": "Weather in Paris?"} | extra)


def test_response_object_from_a_text_answer() -> None:
    obj = response_from_chat(fx.hello_response(), responses(), 3)
    assert (obj["object"], obj["status"], obj["model"], obj["incomplete_details"]) == (
        "response",
        "completed",
        "policy",
        None,
    )
    assert [(i["type"], i["content"][0]["text"]) for i in obj["output"]] == [("message", "Hello there!")]
    assert (obj["usage"], trace_of(obj)) == ({"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}, HELLO_TRACE)


def test_response_object_from_a_tool_call_is_only_a_function_call_item() -> None:
    obj = response_from_chat(fx.tool_response(), responses(tools=[{"type": "function", "name": "get_weather"}]), 3)
    [item] = obj["output"]
    assert (item["type"], item["call_id"], item["name"], item["arguments"], item["status"]) == (
        "function_call",
        fx.TOOL_CALL_ID,
        "get_weather",
        '{"city": "Paris"}',
        "completed",
    )


def test_streamed_response_events_match_the_unstreamed_response() -> None:
    mapper = ResponseStreamMapper(responses(stream=True), 3)
    events = [e for chunk in fx.hello_stream() for e in mapper.push(chunk)] + mapper.finish()
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = events[-1]["response"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello there!"
    assert (completed["output"][0]["content"][0]["text"], trace_of(completed)) == ("Hello there!", HELLO_TRACE)
    assert completed["id"] == events[0]["response"]["id"]


def test_streamed_response_tool_call_is_sent_whole_at_the_end() -> None:
    mapper = ResponseStreamMapper(responses(stream=True, tools=[{"type": "function", "name": "get_weather"}]), 3)
    events = [e for chunk in fx.tool_stream() for e in mapper.push(chunk)] + mapper.finish()
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert json.loads(events[3]["delta"]) == {"city": "Paris"}
    assert trace_of(events[-1]["response"]) == TOOL_TRACE
