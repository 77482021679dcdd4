"""The scripted backend, served by a real uvicorn on loopback: plan replay, both APIs streamed and not, traces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.engines.scripted import (
    ScriptedPlan,
    ScriptedStep,
    ScriptedToolCall,
    create_scripted_app,
    decode_ids,
    encode_text,
    render,
    scripted_logprobs,
)
from orchard.engines.token_trace import TokenTrace, trace_of
from producers.proxy.server import BackgroundServer

TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
PLAN = ScriptedPlan(
    steps=[
        ScriptedStep(text="Let me look.", tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "ls -la"})]),
        ScriptedStep(text="Found it: the bug is in parse(). Fixed."),
        ScriptedStep(text="truncated", finish_reason="length"),
    ],
    final_text="all done",
)
POLICY_VERSION = 7


@pytest.fixture(scope="module")
def backend() -> Iterator[httpx.Client]:
    with BackgroundServer(create_scripted_app(PLAN, POLICY_VERSION)) as server:
        with httpx.Client(base_url=server.url + "/v1", timeout=10) as client:
            yield client


def sse_data(text: str) -> list[tuple[str | None, Any]]:
    """``(event name, data)`` of each event of an SSE body (``[DONE]`` kept as a string)."""
    events = []
    for block in text.strip().split("\n\n"):
        name = next((line[7:] for line in block.split("\n") if line.startswith("event: ")), None)
        data = "\n".join(line[6:] for line in block.split("\n") if line.startswith("data: "))
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def chat(client: httpx.Client, key: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": messages, "tools": TOOLS, "user": key, **extra}
    return client.post("/chat/completions", json=body)


def test_chat_replays_the_plan_in_order_with_tool_calls_and_a_trace(backend: httpx.Client) -> None:
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix it."}]
    first = chat(backend, "chat-order", messages).json()
    assert first["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls -la"}'}}
        ],
    }
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    trace = trace_of(first)
    assert trace is not None
    assert trace.prompt_token_ids == render(messages, TOOLS)
    assert trace.completion_token_ids == render([first["choices"][0]["message"]])
    assert trace.completion_logprobs == scripted_logprobs(len(trace.completion_token_ids))
    assert trace.policy_version == POLICY_VERSION
    assert first["usage"]["completion_tokens"] == len(trace.completion_token_ids)

    replies = [chat(backend, "chat-order", messages).json()["choices"][0] for _ in range(3)]
    assert [(c["message"]["content"], c["finish_reason"]) for c in replies] == [
        ("Found it: the bug is in parse(). Fixed.", "stop"),
        ("truncated", "length"),
        ("all done", "stop"),  # the plan is used up
    ]


def test_a_conversation_prompt_extends_the_previous_prompt_and_completion(backend: httpx.Client) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test, é included."}]
    first = chat(backend, "chat-extend", messages).json()
    reply = first["choices"][0]["message"]
    messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a.py b.py"}]
    second = chat(backend, "chat-extend", messages).json()
    one, two = TokenTrace.model_validate(first["orchard"]), TokenTrace.model_validate(second["orchard"])
    sequence = one.prompt_token_ids + one.completion_token_ids
    assert two.prompt_token_ids[: len(sequence)] == sequence
    assert len(two.prompt_token_ids) > len(sequence)
    assert decode_ids(two.prompt_token_ids[len(sequence) :]).startswith('{"content":"a.py b.py"')  # a new line


def test_streamed_chat_carries_the_same_reply_and_trace_on_its_last_chunk(backend: httpx.Client) -> None:
    messages = [{"role": "user", "content": "go"}]
    plain = chat(backend, "chat-plain", messages).json()
    streamed = chat(backend, "chat-stream", messages, stream=True)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [data for _, data in sse_data(streamed.text)]
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [trace_of(c) is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    arguments = "".join(
        call["function"].get("arguments", "") for c in chunks for call in c["choices"][0]["delta"].get("tool_calls", [])
    )
    message = plain["choices"][0]["message"]
    assert (text, arguments) == (message["content"], message["tool_calls"][0]["function"]["arguments"])
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert trace_of(chunks[-1]) == trace_of(plain)


def test_include_usage_puts_the_trace_on_the_usage_chunk(backend: httpx.Client) -> None:
    streamed = chat(
        backend, "chat-usage", [{"role": "user", "content": "go"}], stream=True, stream_options={"include_usage": True}
    )
    *chunks, done = [data for _, data in sse_data(streamed.text)]
    assert done == "[DONE]"
    assert (chunks[-1]["choices"], trace_of(chunks[-1]) is not None) == ([], True)
    assert chunks[-1]["usage"]["completion_tokens"] == len(trace_of(chunks[-1]).completion_token_ids)  # type: ignore[union-attr]


def test_n_choices_each_carry_their_trace(backend: httpx.Client) -> None:
    body = chat(backend, "chat-n", [{"role": "user", "content": "go"}], n=2).json()
    assert "orchard" not in body
    traces = [trace_of(choice) for choice in body["choices"]]
    assert traces[0] is not None and traces == [traces[0], traces[0]]


def respond(client: httpx.Client, key: str, items: Any, **extra: Any) -> httpx.Response:
    body = {"model": "m", "input": items, "instructions": "You fix bugs.", "tools": TOOLS, **extra}
    return client.post("/responses", json=body, headers={"X-Orchard-Plan-Key": key})


def test_responses_output_items_and_trace(backend: httpx.Client) -> None:
    response = respond(backend, "resp-items", "Fix it.").json()
    assert [item["type"] for item in response["output"]] == ["message", "function_call"]
    assert response["output"][1] | {"id": None} == {
        "type": "function_call",
        "id": None,
        "call_id": "call_0_0",
        "name": "shell",
        "arguments": '{"cmd": "ls -la"}',
        "status": "completed",
    }
    trace = trace_of(response)
    assert trace is not None
    system = {"role": "system", "content": "You fix bugs."}
    assert trace.prompt_token_ids == render([system, {"role": "user", "content": "Fix it."}], TOOLS)
    assert trace.completion_token_ids == render(response["output"])
    assert (response["status"], trace.policy_version) == ("completed", POLICY_VERSION)


def test_responses_stream_events_and_completed_trace(backend: httpx.Client) -> None:
    plain = respond(backend, "resp-plain", "Fix it.").json()
    events = sse_data(respond(backend, "resp-stream", "Fix it.", stream=True).text)
    kinds = [name for name, _ in events]
    assert kinds == [data["type"] for _, data in events]
    assert kinds == [
        "response.created",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    completed = events[-1][1]["response"]
    assert trace_of(completed) == trace_of(plain)
    assert completed["output"] == plain["output"]
    deltas = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert deltas == "Let me look."


def test_responses_conversation_prompt_extends_previous_call(backend: httpx.Client) -> None:
    items: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "input_text", "text": "Fix it."}]}]
    first = respond(backend, "resp-extend", items).json()
    items += first["output"] + [{"type": "function_call_output", "call_id": "call_0_0", "output": "a.py"}]
    second = respond(backend, "resp-extend", items).json()
    one, two = trace_of(first), trace_of(second)
    assert one is not None and two is not None
    sequence = one.prompt_token_ids + one.completion_token_ids
    assert two.prompt_token_ids[: len(sequence)] == sequence
    assert second["output"][0]["content"][0]["text"] == "Found it: the bug is in parse(). Fixed."


def test_length_finish_is_an_incomplete_response(backend: httpx.Client) -> None:
    for _ in range(2):
        respond(backend, "resp-length", "go")
    third = respond(backend, "resp-length", "go").json()
    assert (third["status"], third["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})


def test_without_a_key_all_requests_share_one_cursor() -> None:
    plan = ScriptedPlan(steps=[ScriptedStep(text="one"), ScriptedStep(text="two")])
    with BackgroundServer(create_scripted_app(plan)) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        texts = [httpx.post(f"{server.url}/v1/chat/completions", json=body).json() for _ in range(3)]
        header = {"X-Orchard-Episode-Id": "e-1"}
        keyed = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=header).json()
    assert [t["choices"][0]["message"]["content"] for t in texts] == ["one", "two", "done"]
    assert keyed["choices"][0]["message"]["content"] == "one"


def test_models_and_bad_requests(backend: httpx.Client) -> None:
    assert backend.get("/models").json()["data"][0]["id"] == "orchard-scripted"
    bad = backend.post("/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
    assert backend.post("/chat/completions", json={"model": "m", "messages": []}).status_code == 400
    assert backend.post("/responses", json={"model": "m", "input": 3}).status_code == 400


def test_tokenize_counts_a_chat_prompt_without_advancing_the_plan() -> None:
    messages = [{"role": "user", "content": "count me"}]
    with BackgroundServer(create_scripted_app(PLAN)) as server, httpx.Client(base_url=server.url + "/v1") as client:
        counted = client.post("/tokenize", json={"model": "m", "messages": messages, "tools": TOOLS}).json()
        answer = chat(client, "tokenize", messages).json()
        assert client.post("/tokenize", json={"model": "m"}).status_code == 400
    prompt = render(messages, TOOLS)
    assert counted == {"count": len(prompt), "max_model_len": None, "tokens": prompt}
    assert (answer["choices"][0]["message"]["content"], trace_of(answer).prompt_token_ids) == ("Let me look.", prompt)  # type: ignore[union-attr]


def test_plans_load_from_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(
        "- text: hello\n- tool_calls: [{name: shell, arguments: {cmd: ls}}]\n  finish_reason: tool_calls\n"
    )
    spec = {
        "steps": [
            {"text": "hello"},
            {"tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}], "finish_reason": "tool_calls"},
        ],
        "final_text": "bye",
    }
    (tmp_path / "plan.json").write_text(json.dumps(spec))
    from_yaml, from_json = (
        ScriptedPlan.from_file(tmp_path / "plan.yaml"),
        ScriptedPlan.from_file(tmp_path / "plan.json"),
    )
    assert from_yaml.steps == from_json.steps
    assert (from_yaml.final_text, from_json.final_text) == ("done", "bye")
    assert from_json.step(5) == ScriptedStep(text="bye")
    assert ScriptedStep(tool_calls=from_json.steps[1].tool_calls).finish == "tool_calls"
    assert ScriptedStep().finish == "stop"


def test_token_ids_are_three_byte_pieces_of_utf8() -> None:
    assert encode_text("abcé") == [16 + (2 << 24 | 0x616263), 16 + (1 << 24 | 0xC3A9)]
    assert encode_text("") == []
    for text in ("héllo\n", "ab", "abc", "日本語のテキスト", "x" * 100):
        assert decode_ids(encode_text(text)) == text
        assert len(encode_text(text)) == -(-len(text.encode()) // 3)
    assert max(encode_text("\U0010ffff" * 3)) < 2**31
