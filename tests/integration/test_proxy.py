"""The recording proxy end to end: real uvicorn servers on loopback (proxy, scripted backend, stub backends), real
HTTP through httpx, and the embedded bus read back to check what was recorded, token for token."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.bus import DeliveryError, open_bus
from orchard.bus.base import Delivery, DeliveryCallback
from orchard.bus.embedded import EmbeddedBus
from orchard.bus.embedded.producers import EmbeddedProducer
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall, create_scripted_app, encode_text
from orchard.engines.token_trace import TokenTrace, trace_of
from orchard.prefix_delta import PromptReconstructor
from orchard.tokens import unpack_array, unpack_token_ids
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

ADMIN = "admin-token-for-tests-0123456789"
TOOLS = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
MESSAGES_TOOLS = [{"name": "shell", "input_schema": {"type": "object"}}]  # TOOLS in the Messages API
PLAN = ScriptedPlan(
    steps=[
        ScriptedStep(text="Looking around.", tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "ls"})]),
        ScriptedStep(tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "cat a.py"})]),
        ScriptedStep(text="Fixed: parse() now strips whitespace."),
    ]
)
POLICY_VERSION = 5
TIMING_FIELDS = ("latency_ms", "timestamp")


# ------------------------------------------------------------------------------------------------ servers and bus
@pytest.fixture(scope="module")
def backend() -> Iterator[BackgroundServer]:
    with BackgroundServer(create_scripted_app(PLAN, POLICY_VERSION)) as server:
        yield server


def make_bus(path: Path, bus_class: type[EmbeddedBus] = EmbeddedBus) -> EmbeddedBus:
    bus = bus_class(EmbeddedBusConfig(path=path))
    bus.create_topic("model-calls", partitions=2, exist_ok=True)
    return bus


class Proxy:
    """A running proxy and an admin client for it."""

    def __init__(self, server: BackgroundServer, bus_path: Path) -> None:
        self.server, self.bus_path, self.url = server, bus_path, server.url
        self.admin = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)

    def open(self, episode_id: str, ttl_s: float = 300) -> Harness:
        spec = {"episode_id": episode_id, "task_id": "task-1", "harness": "test", "model": "policy", "ttl_s": ttl_s}
        grant = self.admin.post("/admin/episodes", json=spec)
        assert grant.status_code == 201, grant.text
        return Harness(self.url, grant.json()["token"], episode_id)

    def close(self, episode_id: str) -> httpx.Response:
        return self.admin.delete(f"/admin/episodes/{episode_id}")

    def records(self, episode_id: str | None = None) -> list[dict[str, Any]]:
        """Every ModelCall on the bus (of one episode), in publishing order."""
        codec, consumer = Codec.default(), open_bus(EmbeddedBusConfig(path=self.bus_path)).consumer(["model-calls"])
        raw = []
        while batch := consumer.poll(1000, 0.05):
            raw += batch
        raw.sort(key=lambda r: (r.partition, r.offset))
        records = [codec.decode(r.value).record for r in raw]
        return [r for r in records if episode_id is None or r["episode_id"] == episode_id]


@pytest.fixture
def start_proxy(tmp_path: Path, backend: BackgroundServer) -> Iterator[Callable[..., Proxy]]:
    servers: list[BackgroundServer] = []

    def start(bus_class: type[EmbeddedBus] = EmbeddedBus, **overrides: Any) -> Proxy:
        path = tmp_path / f"bus-{len(servers)}"
        settings = ProxySettings(
            backend_base_url=overrides.pop("backend_base_url", f"{backend.url}/v1"), admin_token=ADMIN, **overrides
        )
        server = BackgroundServer(create_proxy_app(settings, make_bus(path, bus_class))).start()
        servers.append(server)
        return Proxy(server, path)

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def proxy(start_proxy: Callable[..., Proxy]) -> Proxy:
    return start_proxy()


class Harness:
    """What an agent harness does: OpenAI calls with its episode token, keeping its own history."""

    def __init__(self, url: str, token: str, episode_id: str) -> None:
        self.episode_id, self.token = episode_id, token
        self.client = httpx.Client(base_url=f"{url}/v1", headers={"authorization": f"Bearer {token}"}, timeout=30)
        anthropic = {"x-api-key": token, "anthropic-version": "2023-06-01"}  # as Anthropic clients authenticate
        self.anthropic = httpx.Client(base_url=f"{url}/v1", headers=anthropic, timeout=30)

    def post(self, path: str, body: dict[str, Any], stream: bool) -> tuple[httpx.Response, dict[str, Any]]:
        """The HTTP response and the answer object (assembled from the stream when streamed)."""
        response = self.client.post(path, json=body | {"stream": stream})
        if not stream or response.status_code != 200:
            return response, response.json()
        return response, assemble(path, response.text)

    def chat(self, messages: list[dict[str, Any]], stream: bool = False, **extra: Any) -> dict[str, Any]:
        body = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.7, **extra}
        response, answer = self.post("/chat/completions", body, stream)
        assert response.status_code == 200, response.text
        return answer

    def messages(self, messages: list[dict[str, Any]], stream: bool = False, **extra: Any) -> dict[str, Any]:
        """An Anthropic Messages call (``?beta=true``, as Claude Code sends it); the Message, assembled if streamed."""
        body = {"model": "policy", "max_tokens": 256, "system": "You fix bugs.", "messages": messages, **extra}
        body |= {"tools": MESSAGES_TOOLS, "temperature": 0.7} | ({"stream": True} if stream else {})
        response = self.anthropic.post("/messages?beta=true", json=body)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream" if stream else "application/json")
        return assemble_message(response.text) if stream else response.json()

    def respond(self, items: list[dict[str, Any]], stream: bool = False) -> dict[str, Any]:
        body = {"model": "policy", "input": items, "instructions": "Fix bugs.", "tools": TOOLS, "top_p": 0.9}
        response, answer = self.post("/responses", body, stream)
        assert response.status_code == 200, response.text
        return answer


def sse(text: str) -> list[tuple[str | None, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        name = next((line[7:] for line in lines if line.startswith("event: ")), None)
        data = "\n".join(line[6:] for line in lines if line.startswith("data: "))
        events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def assemble(path: str, text: str) -> dict[str, Any]:
    """The non-streamed equivalent of a stream, as a client library would build it."""
    assert '"orchard"' not in text
    events = sse(text)
    if path == "/responses":
        return events[-1][1]["response"]
    assert events[-1][1] == "[DONE]"
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for _, chunk in events[:-1]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"], {"id": part.get("id"), "type": "function", "name": "", "args": ""}
                )
                call["name"] += part.get("function", {}).get("name") or ""
                call["args"] += part.get("function", {}).get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
            for _, c in sorted(calls.items())
        ]
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def assemble_message(text: str) -> dict[str, Any]:
    """The Message a Messages stream carries, as a client library builds it, checking the stream is well formed:
    named events, message_start and ping first, blocks opened, filled and closed one at a time in index order,
    message_delta and message_stop last."""
    assert '"orchard"' not in text
    events = sse(text)
    assert all(name == data["type"] for name, data in events)
    kinds = [data["type"] for _, data in events]
    assert (kinds[:2], kinds[-2:]) == (["message_start", "ping"], ["message_delta", "message_stop"])
    message, open_index, arguments = events[0][1]["message"], None, ""
    for _, event in events[2:-2]:
        if event["type"] == "content_block_start":
            assert (open_index, event["index"]) == (None, len(message["content"]))
            open_index = event["index"]
            message["content"].append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
            block, delta = message["content"][open_index], event["delta"]
            if delta["type"] == "input_json_delta":
                arguments += delta["partial_json"]
            else:
                assert (block["type"], delta["type"]) == ("text", "text_delta")
                block["text"] += delta["text"]
        else:
            assert (event["type"], event["index"]) == ("content_block_stop", open_index)
            if message["content"][open_index]["type"] == "tool_use":
                message["content"][open_index]["input"], arguments = json.loads(arguments or "{}"), ""
            open_index = None
    assert open_index is None
    final = events[-2][1]
    return message | final["delta"] | {"usage": final["usage"]}


def direct_trace(backend: BackgroundServer, path: str, body: dict[str, Any], key: str) -> TokenTrace:
    """What the backend itself answers (its trace) to ``body`` as request number N of plan key ``key``."""
    answer = httpx.post(f"{backend.url}/v1{path}", json=body, headers={"X-Orchard-Plan-Key": key}, timeout=10).json()
    trace = trace_of(answer)
    assert trace is not None
    return trace


def tool_result(call_id: str, output: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def without(record: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in fields}


# ------------------------------------------------------------------------------------------------ recording
def run_chat_episode(harness: Harness, stream: bool) -> list[list[dict[str, Any]]]:
    """A three-call tool-using conversation; returns the messages sent with each call."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix"},
    ]
    sent = []
    for output in ("a.py b.py", "def parse(): ...", None):
        sent.append(list(messages))
        reply = harness.chat(messages, stream)["choices"][0]["message"]
        if output is not None:
            messages += [reply, tool_result(reply["tool_calls"][0]["id"], output)]
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chat_calls_are_recorded_token_exactly(proxy: Proxy, backend: BackgroundServer, stream: bool) -> None:
    harness = proxy.open(f"chat-{stream}")
    sent = run_chat_episode(harness, stream)
    assert proxy.close(harness.episode_id).json()["calls_recorded"] == 3
    records = proxy.records(harness.episode_id)
    rebuilt = PromptReconstructor()
    for index, (record, messages) in enumerate(zip(records, sent, strict=True)):
        body = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.7}
        expected = direct_trace(backend, "/chat/completions", body, f"direct-chat-{stream}")
        assert rebuilt.add_model_call(record).tolist() == expected.prompt_token_ids
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == expected.completion_token_ids
        logprobs = unpack_array(record["completion_logprobs"], "float32")
        assert logprobs.tolist() == np.asarray(expected.completion_logprobs, dtype=np.float32).tolist()
        assert rebuilt.messages(index) == messages
        assert (record["call_index"], record["conversation_id"], record["policy_version"]) == (index, 0, POLICY_VERSION)
        assert (record["api_flavour"], record["model"], record["harness"], record["run_id"]) == (
            "CHAT",
            "policy",
            "test",
            "default",
        )
        assert json.loads(record["request_tools_json"]) == TOOLS
        assert json.loads(record["sampling_params_json"]) == {"temperature": 0.7}
    assert [(r["response_text"], r["finish_reason"]) for r in records] == [
        ("Looking around.", "tool_calls"),
        ("", "tool_calls"),
        ("Fixed: parse() now strips whitespace.", "stop"),
    ]
    assert json.loads(records[1]["response_tool_calls_json"]) == [
        {"id": "call_1_0", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "cat a.py"}'}}
    ]
    assert records[2]["prompt_base_call_index"] == 1  # prefix delta against the previous call
    assert all(r["latency_ms"] > 0 for r in records)


def test_a_streamed_call_is_recorded_like_its_non_streamed_equivalent(proxy: Proxy) -> None:
    plain, streamed = proxy.open("same-plain"), proxy.open("same-streamed")
    run_chat_episode(plain, stream=False)
    run_chat_episode(streamed, stream=True)
    plain.respond([{"role": "user", "content": "and now with responses"}], stream=False)
    streamed.respond([{"role": "user", "content": "and now with responses"}], stream=True)
    for episode in ("same-plain", "same-streamed"):
        assert proxy.close(episode).json()["calls_recorded"] == 4
    ignored = ("episode_id", *TIMING_FIELDS)
    assert [without(r, *ignored) for r in proxy.records("same-streamed")] == [
        without(r, *ignored) for r in proxy.records("same-plain")
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_responses_calls_are_recorded_token_exactly(proxy: Proxy, backend: BackgroundServer, stream: bool) -> None:
    harness = proxy.open(f"responses-{stream}")
    items: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "input_text", "text": "Fix"}]}]
    sent = []
    for _ in range(3):
        sent.append(list(items))
        output = harness.respond(items, stream)["output"]
        calls = [item for item in output if item["type"] == "function_call"]
        items += output + [{"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in calls]
    assert proxy.close(harness.episode_id).json()["calls_recorded"] == 3
    records, rebuilt = proxy.records(harness.episode_id), PromptReconstructor()
    for index, (record, input_items) in enumerate(zip(records, sent, strict=True)):
        body = {"model": "policy", "input": input_items, "instructions": "Fix bugs.", "tools": TOOLS, "top_p": 0.9}
        expected = direct_trace(backend, "/responses", body, f"direct-responses-{stream}")
        assert rebuilt.add_model_call(record).tolist() == expected.prompt_token_ids
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == expected.completion_token_ids
        assert rebuilt.messages(index) == [{"role": "system", "content": "Fix bugs."}, *input_items]
        assert (record["api_flavour"], record["conversation_id"]) == ("RESPONSES", 0)
    assert [r["finish_reason"] for r in records] == ["tool_calls", "tool_calls", "stop"]
    assert [c["name"] for c in json.loads(records[0]["response_tool_calls_json"])] == ["shell"]
    assert json.loads(records[0]["sampling_params_json"]) == {"top_p": 0.9}


def test_the_harness_never_sees_the_trace(proxy: Proxy) -> None:
    harness = proxy.open("no-trace-leak")
    messages = [{"role": "user", "content": "hi"}]
    for path, body in (
        ("/chat/completions", {"model": "policy", "messages": messages}),
        ("/chat/completions", {"model": "policy", "messages": messages, "n": 2}),
        ("/responses", {"model": "policy", "input": "hi"}),
    ):
        for stream in (False, True) if "n" not in body else (False,):
            response = harness.client.post(path, json=body | {"stream": stream})
            assert response.status_code == 200
            assert "orchard" not in response.text
    assert proxy.close("no-trace-leak").json()["calls_recorded"] == 6  # n=2 is two calls


# ------------------------------------------------------------------------------------------------ refusals
def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code


def test_unknown_expired_and_revoked_tokens_are_refused(proxy: Proxy) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic abc"}):
        assert_openai_error(httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers), 401)
    short = proxy.open("short-lived", ttl_s=0.3)
    time.sleep(0.4)
    assert_openai_error(short.client.post("/chat/completions", json=body), 401, "token_expired")
    revoked = proxy.open("revoked")
    assert proxy.close("revoked").json()["calls_recorded"] == 0
    assert_openai_error(revoked.client.post("/chat/completions", json=body), 401, "invalid_api_key")
    assert_openai_error(revoked.client.get("/models"), 401)
    assert proxy.admin.get("/admin/episodes/short-lived").json()["state"] == "expired"
    assert proxy.close("short-lived").json()["calls_recorded"] == 0
    assert proxy.records() == []


def test_bad_requests_get_openai_errors_and_nothing_is_recorded(start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(max_request_bytes=4096)
    harness = proxy.open("bad-requests")
    post = harness.client.post
    assert_openai_error(post("/chat/completions", content=b'{"model": "policy", "messages": ['), 400, "invalid_json")
    assert_openai_error(post("/chat/completions", content=b"[1, 2]"), 400, "invalid_json")
    assert_openai_error(post("/chat/completions", json={"messages": [{"role": "user"}]}), 400, "missing_model")
    assert_openai_error(post("/chat/completions", json={"model": "policy"}), 400, "missing_messages")
    assert_openai_error(post("/chat/completions", json={"model": "p", "messages": ["x"]}), 400, "invalid_request")
    assert_openai_error(post("/responses", json={"model": "policy"}), 400, "missing_input")
    big = {"model": "policy", "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_openai_error(post("/chat/completions", json=big), 413, "request_too_large")
    chunks = iter([b'{"model": "policy", "messages": [{"role": "user", "content": "', b"y" * 5000, b'"}]}'])
    assert_openai_error(post("/chat/completions", content=chunks), 413, "request_too_large")  # no Content-Length
    stream_n = {"model": "policy", "messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2}
    assert_openai_error(post("/chat/completions", json=stream_n), 400, "unsupported")
    # none of them reached the backend: the first real call gets the plan's first step
    assert harness.chat([{"role": "user", "content": "x"}])["choices"][0]["message"]["content"] == "Looking around."
    summary = proxy.close("bad-requests").json()
    assert (summary["calls_received"], counts(summary)) == (1, {"recorded": 1})  # refused before forwarding: no calls
    assert len(proxy.records()) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_backend_down_is_502_and_backend_timeout_is_504(start_proxy: Callable[..., Proxy]) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    down = start_proxy(backend_base_url=f"http://127.0.0.1:{free_port()}/v1")
    harness = down.open("backend-down")
    for stream in (False, True):
        assert_openai_error(
            harness.client.post("/chat/completions", json=body | {"stream": stream}), 502, "backend_unavailable"
        )
    assert_openai_error(harness.client.get("/models"), 502, "backend_unavailable")
    assert counts(down.close("backend-down").json()) == {"backend_failed": 2}  # /models is not a model call

    slow_plan = ScriptedPlan(steps=[ScriptedStep(text="late", delay_s=5)] * 2)
    with BackgroundServer(create_scripted_app(slow_plan), timeout_graceful_shutdown=0.1) as slow:
        proxy = start_proxy(backend_base_url=f"{slow.url}/v1", request_timeout_s=0.3)
        harness = proxy.open("backend-slow")
        for stream in (False, True):
            started = time.perf_counter()
            response = harness.client.post("/responses", json={"model": "p", "input": "hi", "stream": stream})
            assert_openai_error(response, 504, "backend_timeout")
            assert time.perf_counter() - started < 2
        assert counts(proxy.close("backend-slow").json()) == {"backend_failed": 2}
        assert down.records() == proxy.records() == []


@pytest.fixture(scope="module")
def stub_backend() -> Iterator[tuple[BackgroundServer, dict[str, str]]]:
    """A backend misbehaving on demand: ``mode["chat"]`` picks the answer."""
    mode = {"chat": "plain"}
    app = FastAPI()
    choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    plain = {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        streamed = (await request.json()).get("stream")
        if mode["chat"] == "reject":
            error = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate"}}
            return JSONResponse(error, 429)
        if mode["chat"] == "crash":
            return JSONResponse({"error": {"message": "engine died", "type": "server_error"}}, 500)
        if mode["chat"] == "bad-trace":
            return JSONResponse(plain | {"orchard": {"prompt_token_ids": [1], "completion_token_ids": [2]}})
        if not streamed:
            return JSONResponse(plain)
        chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
        return StreamingResponse(
            iter([f"data: {json.dumps(chunk)}\n\n", "data: [DONE]\n\n"]), media_type="text/event-stream"
        )

    with BackgroundServer(app) as server:
        yield server, mode


def test_backend_answers_without_a_valid_trace_or_with_errors(
    start_proxy: Callable[..., Proxy], stub_backend: tuple[BackgroundServer, dict[str, str]]
) -> None:
    server, mode = stub_backend
    proxy = start_proxy(backend_base_url=f"{server.url}/v1")
    harness = proxy.open("stub")
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    mode["chat"] = "plain"
    assert_openai_error(harness.client.post("/chat/completions", json=body), 502, "no_trace")
    streamed = harness.client.post("/chat/completions", json=body | {"stream": True})
    events = [data for _, data in sse(streamed.text)]
    assert events[-1]["error"]["code"] == "no_trace"  # the error replaces [DONE]
    assert "[DONE]" not in events
    mode["chat"] = "bad-trace"
    assert_openai_error(harness.client.post("/chat/completions", json=body), 502, "invalid_trace")
    mode["chat"] = "reject"
    for stream in (False, True):
        rejected = harness.client.post("/chat/completions", json=body | {"stream": stream})
        assert (rejected.status_code, rejected.json()["error"]["code"]) == (429, "rate")  # passed through
    mode["chat"] = "crash"
    for stream in (False, True):
        assert_openai_error(
            harness.client.post("/chat/completions", json=body | {"stream": stream}), 502, "backend_error"
        )
    assert "engine died" in harness.client.post("/chat/completions", json=body).json()["error"]["message"]
    summary = proxy.close("stub").json()
    assert (summary["calls_received"], counts(summary)) == (8, {"refused": 2, "backend_failed": 6})
    assert proxy.records() == []


# ------------------------------------------------------------------------------------------------ Messages API
def run_messages_episode(harness: Harness, stream: bool) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """``run_chat_episode`` through the Messages API: the chat conversation each call is equivalent to, and the
    Messages answered."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix"}]
    chat: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix"}]
    sent, replies = [], []
    for output in ("a.py b.py", "def parse(): ...", None):
        sent.append(list(chat))
        reply = harness.messages(messages, stream)
        replies.append(reply)
        if output is None:
            break
        call = next(block for block in reply["content"] if block["type"] == "tool_use")
        text = "".join(block["text"] for block in reply["content"] if block["type"] == "text")
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": output}
        messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": [result]}]
        function = {"name": call["name"], "arguments": json.dumps(call["input"])}
        assistant = {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [{"id": call["id"], "type": "function", "function": function}],
        }
        chat += [assistant, tool_result(call["id"], output)]
    return sent, replies


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_messages_calls_are_recorded_token_exactly(proxy: Proxy, backend: BackgroundServer, stream: bool) -> None:
    harness = proxy.open(f"messages-{stream}")
    sent, replies = run_messages_episode(harness, stream)
    summary = proxy.close(harness.episode_id).json()
    assert (summary["calls_received"], summary["calls_recorded"], summary["conversations"]) == (3, 3, 1)
    records, rebuilt = proxy.records(harness.episode_id), PromptReconstructor()
    for index, (record, messages, reply) in enumerate(zip(records, sent, replies, strict=True)):
        body = {"model": "policy", "messages": messages, "tools": TOOLS, "temperature": 0.7, "max_tokens": 256}
        expected = direct_trace(backend, "/chat/completions", body, f"direct-messages-{stream}")
        assert rebuilt.add_model_call(record).tolist() == expected.prompt_token_ids
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == expected.completion_token_ids
        logprobs = unpack_array(record["completion_logprobs"], "float32")
        assert logprobs.tolist() == np.asarray(expected.completion_logprobs, dtype=np.float32).tolist()
        assert rebuilt.messages(index) == messages  # recorded in chat form, as the engine was asked
        assert (record["api_flavour"], record["harness_api"], record["conversation_id"]) == ("CHAT", "MESSAGES", 0)
        assert json.loads(record["request_tools_json"]) == TOOLS
        assert json.loads(record["sampling_params_json"]) == {"max_tokens": 256, "temperature": 0.7}
        usage = {"input_tokens": len(expected.prompt_token_ids), "output_tokens": len(expected.completion_token_ids)}
        assert reply["usage"] == usage | {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    assert [(r["response_text"], r["finish_reason"]) for r in records] == [
        ("Looking around.", "tool_calls"),
        ("", "tool_calls"),
        ("Fixed: parse() now strips whitespace.", "stop"),
    ]
    assert [without(reply, "id", "usage") for reply in replies] == [
        {"type": "message", "role": "assistant", "model": "policy", "stop_reason": reason, "stop_sequence": None,
         "content": content}
        for reason, content in [
            ("tool_use", [{"type": "text", "text": "Looking around."},
                          {"type": "tool_use", "id": "call_0_0", "name": "shell", "input": {"cmd": "ls"}}]),
            ("tool_use", [{"type": "tool_use", "id": "call_1_0", "name": "shell", "input": {"cmd": "cat a.py"}}]),
            ("end_turn", [{"type": "text", "text": "Fixed: parse() now strips whitespace."}]),
        ]
    ]  # fmt: skip


def test_a_streamed_messages_call_is_recorded_like_its_non_streamed_equivalent(proxy: Proxy) -> None:
    _, plain = run_messages_episode(proxy.open("messages-same-plain"), stream=False)
    _, streamed = run_messages_episode(proxy.open("messages-same-streamed"), stream=True)
    assert [without(r, "id") for r in streamed] == [without(r, "id") for r in plain]
    for episode in ("messages-same-plain", "messages-same-streamed"):
        assert proxy.close(episode).json()["calls_recorded"] == 3
    ignored = ("episode_id", *TIMING_FIELDS)
    assert [without(r, *ignored) for r in proxy.records("messages-same-streamed")] == [
        without(r, *ignored) for r in proxy.records("messages-same-plain")
    ]


def assert_anthropic_error(response: httpx.Response, status: int, kind: str, message: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert (set(body), body["type"], set(body["error"]), body["error"]["type"]) == (
        {"type", "error"}, "error", {"type", "message"}, kind
    )  # fmt: skip
    assert message in body["error"]["message"] and body["error"]["message"]


def test_every_model_route_takes_x_api_key_or_bearer_and_messages_routes_answer_anthropic_errors(
    proxy: Proxy, backend: BackgroundServer
) -> None:
    harness = proxy.open("messages-routes")
    hello = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"x-api-key": "nope"}, {"authorization": "Bearer nope"}, {"authorization": "Basic abc"}):
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            response = httpx.post(f"{proxy.url}{path}", json=hello, headers=headers)
            assert_anthropic_error(response, 401, "authentication_error")
        response = httpx.post(f"{proxy.url}/v1/responses", json={"model": "p", "input": "hi"}, headers=headers)
        assert_openai_error(response, 401)
    key = harness.anthropic  # x-api-key on every model route
    assert key.post("/chat/completions", json={"model": "policy", "messages": hello["messages"]}).status_code == 200
    assert key.post("/responses", json={"model": "policy", "input": "hi"}).status_code == 200
    assert key.get("/models").json()["data"][0]["id"] == "orchard-scripted"
    assert harness.client.post("/messages", json=hello).status_code == 200  # and Bearer on the Messages route
    assert_anthropic_error(key.post("/messages", content=b'{"model": '), 400, "invalid_request_error", "not valid JSON")
    assert_anthropic_error(key.post("/messages", json=hello | {"messages": []}), 400, "invalid_request_error")
    server_tool = hello | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    response = key.post("/messages?beta=true", json=server_tool)
    assert_anthropic_error(response, 400, "invalid_request_error", "server tools")
    thought = [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "Hi."}]
    history = [*hello["messages"], {"role": "assistant", "content": thought}, {"role": "user", "content": "again"}]
    thinking = {"model": "policy", "messages": history, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert key.post("/messages", json=thinking | {"max_tokens": 16}).status_code == 200  # thinking tolerated
    counted = key.post("/messages/count_tokens?beta=true", json=thinking)
    as_chat = [history[0], {"role": "assistant", "content": "Hi.", "reasoning_content": "hmm"}, history[2]]
    prompt = direct_trace(backend, "/chat/completions", {"model": "policy", "messages": as_chat}, "count")
    assert counted.json() == {"input_tokens": len(prompt.prompt_token_ids)}
    summary = proxy.close("messages-routes").json()
    assert (summary["calls_received"], summary["calls_recorded"]) == (4, 4)  # count_tokens is not a model call
    apis = [r["harness_api"] for r in proxy.records("messages-routes")]
    assert apis == ["CHAT", "RESPONSES", "MESSAGES", "MESSAGES"]


def counts(summary: dict[str, Any]) -> dict[str, int]:
    """The call counts of a summary that add up to ``calls_received``."""
    names = ("recorded", "pending", "failed", "dropped", "abandoned", "refused", "backend_failed", "in_flight")
    values = {name: summary[f"calls_{name}"] for name in names}
    assert sum(values.values()) == summary["calls_received"]
    return {name: value for name, value in values.items() if value}


def test_backend_failures_on_messages_routes_are_anthropic_errors_and_are_counted(
    start_proxy: Callable[..., Proxy], stub_backend: tuple[BackgroundServer, dict[str, str]]
) -> None:
    server, mode = stub_backend
    proxy = start_proxy(backend_base_url=f"{server.url}/v1")
    harness = proxy.open("messages-stub")
    hello = {"model": "policy", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    mode["chat"] = "plain"
    assert_anthropic_error(harness.anthropic.post("/messages", json=hello), 502, "api_error", "token trace")
    streamed = sse(harness.anthropic.post("/messages", json=hello | {"stream": True}).text)
    assert [name for name, _ in streamed] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert streamed[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "the backend's stream ended without a token trace"},
    }
    mode["chat"] = "reject"
    assert_anthropic_error(harness.anthropic.post("/messages", json=hello), 429, "rate_limit_error", "slow down")
    mode["chat"] = "crash"
    assert_anthropic_error(harness.anthropic.post("/messages", json=hello), 502, "api_error", "engine died")
    assert_anthropic_error(
        harness.anthropic.post("/messages/count_tokens", json=hello), 404, "not_found_error", "/tokenize"
    )
    assert counts(proxy.close("messages-stub").json()) == {"refused": 1, "backend_failed": 3}
    assert proxy.records() == []


@pytest.fixture(scope="module")
def trickle_backend() -> Iterator[BackgroundServer]:
    """A slow backend: a plain answer comes after a second; a stream pauses for a second after its first chunk, or
    before it starts when the last message says ``wait``."""
    app = FastAPI()
    trace = TokenTrace(prompt_token_ids=[1], completion_token_ids=[2], completion_logprobs=[0.0], policy_version=0)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body, head = await request.json(), {"id": "x", "object": "chat.completion.chunk"}
        if not body.get("stream"):
            await asyncio.sleep(1.0)
            choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
            return JSONResponse({"id": "x", "object": "chat.completion", "choices": [choice]} | trace.as_field())
        if body["messages"][-1]["content"] == "wait":
            await asyncio.sleep(1.0)
        first = head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
        last = head | {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}

        async def chunks() -> AsyncIterator[str]:
            yield f"data: {json.dumps(first)}\n\n"
            await asyncio.sleep(1.0)
            yield f"data: {json.dumps(last | trace.as_field())}\n\ndata: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    with BackgroundServer(app, timeout_graceful_shutdown=0.1) as server:
        yield server


def test_calls_the_harness_abandons_are_counted_and_never_recorded(
    start_proxy: Callable[..., Proxy], trickle_backend: BackgroundServer
) -> None:
    """A harness that hangs up while the backend works on its call (not streamed, before its stream starts, or in
    the middle of it) abandons the call: the proxy notices the hang-up, records nothing and counts it abandoned."""
    proxy = start_proxy(backend_base_url=f"{trickle_backend.url}/v1")
    harness = proxy.open("abandoned")
    hi, wait = [{"role": "user", "content": "hi"}], [{"role": "user", "content": "wait"}]
    chat, messages = {"model": "policy", "messages": hi}, {"model": "policy", "messages": hi, "max_tokens": 9}
    calls = [
        (harness.client, "/chat/completions", chat),
        (harness.anthropic, "/messages", messages),
        (harness.client, "/chat/completions", chat | {"messages": wait, "stream": True}),
        (harness.anthropic, "/messages", messages | {"messages": wait, "stream": True}),
        (harness.client, "/chat/completions", chat | {"stream": True}),
        (harness.anthropic, "/messages", messages | {"stream": True}),
    ]
    for client, path, body in calls:
        with pytest.raises(httpx.ReadTimeout):
            client.post(path, json=body, timeout=0.2)  # the harness gives up before the answer and hangs up
    deadline = time.monotonic() + 10
    while (summary := proxy.admin.get("/admin/episodes/abandoned").json())["calls_in_flight"]:
        assert time.monotonic() < deadline, summary
        time.sleep(0.05)
    assert counts(summary) == {"abandoned": len(calls)}
    assert harness.chat(hi)["choices"][0]["message"]["content"] == "hi"
    assert assemble_message(harness.anthropic.post("/messages", json=messages | {"stream": True}).text)["content"] == [
        {"type": "text", "text": "hi"}
    ]
    assert counts(proxy.close("abandoned").json()) == {"abandoned": len(calls), "recorded": 2}
    assert [(r["call_index"], r["harness_api"]) for r in proxy.records("abandoned")] == [(0, "CHAT"), (1, "MESSAGES")]


# ------------------------------------------------------------------------------------------------ closing
class GatedProducer(EmbeddedProducer):
    """Flushes only once ``gate`` is open."""

    gate = threading.Event()

    def flush(self, timeout_s: float = 30.0) -> None:
        assert self.gate.wait(30)
        super().flush(timeout_s)


class GatedBus(EmbeddedBus):
    def producer(self) -> EmbeddedProducer:
        return GatedProducer(self)


class FailingProducer(EmbeddedProducer):
    """Every record fails to be written: its delivery reports an error and ``flush`` raises."""

    def __init__(self, bus: EmbeddedBus) -> None:
        super().__init__(bus)
        self.queued: list[DeliveryCallback] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **kwargs: Any) -> None:
        self.queued.append(kwargs["on_delivery"])

    def flush(self, timeout_s: float = 30.0) -> None:
        failed, self.queued = self.queued, []
        for callback in failed:
            callback(Delivery("model-calls", 0, -1, "disk on fire"))
        if failed:
            raise DeliveryError("records were not written: disk on fire")


class FailingBus(EmbeddedBus):
    def producer(self) -> EmbeddedProducer:
        return FailingProducer(self)


def test_closing_returns_only_once_the_bus_acknowledged_every_call(start_proxy: Callable[..., Proxy]) -> None:
    GatedProducer.gate.clear()
    try:
        proxy = start_proxy(GatedBus, flush_interval_s=60)
        harness = proxy.open("gated")
        run_chat_episode(harness, stream=False)
        deadline = time.monotonic() + 5
        while proxy.admin.get("/admin/episodes/gated").json()["calls_pending"] < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert proxy.records() == []  # produced, not yet acknowledged: nothing on the log
        with ThreadPoolExecutor(1) as pool:
            closing = pool.submit(proxy.close, "gated")
            time.sleep(0.3)
            assert not closing.done()  # waiting for the bus
            GatedProducer.gate.set()
            summary = closing.result(10).json()
    finally:
        GatedProducer.gate.set()
    assert (summary["state"], summary["calls_recorded"], summary["calls_pending"]) == ("closed", 3, 0)
    assert [r["call_index"] for r in proxy.records("gated")] == [0, 1, 2]  # all there the moment it returned
    assert proxy.close("gated").json() == summary  # idempotent


def test_closing_reports_calls_the_bus_did_not_take(start_proxy: Callable[..., Proxy]) -> None:
    proxy = start_proxy(FailingBus, flush_interval_s=60)
    harness = proxy.open("failing")
    harness.chat([{"role": "user", "content": "hi"}])
    response = proxy.close("failing")
    assert_openai_error(response, 503, "recording_incomplete")
    assert response.json()["episode"]["calls_failed"] == 1
    assert proxy.admin.get("/admin/episodes/failing").json()["state"] == "closing"


def test_admin_routes(proxy: Proxy) -> None:
    spec = {"episode_id": "admin-1", "task_id": "t", "harness": "h", "model": "m", "ttl_s": 60}
    assert_openai_error(httpx.post(f"{proxy.url}/admin/episodes", json=spec), 401, "invalid_admin_token")
    wrong = {"authorization": "Bearer not-the-admin-token"}
    assert_openai_error(httpx.delete(f"{proxy.url}/admin/episodes/x", headers=wrong), 401)
    assert proxy.admin.post("/admin/episodes", json=spec).status_code == 201
    assert_openai_error(proxy.admin.post("/admin/episodes", json=spec), 409, "episode_exists")
    assert_openai_error(proxy.admin.post("/admin/episodes", json=spec | {"ttl_s": -1}), 400)
    assert_openai_error(proxy.admin.post("/admin/episodes", json=spec | {"extra": 1}), 400)
    assert_openai_error(proxy.admin.get("/admin/episodes/nope"), 404)
    assert_openai_error(proxy.admin.delete("/admin/episodes/nope"), 404)
    assert proxy.admin.get("/admin/episodes/admin-1").json()["state"] == "active"
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok", "episodes": 1}
    assert_openai_error(httpx.get(f"{proxy.url}/v1/nothing-here"), 404)


def test_models_are_forwarded(proxy: Proxy) -> None:
    harness = proxy.open("models")
    assert harness.client.get("/models").json()["data"][0]["id"] == "orchard-scripted"


# ------------------------------------------------------------------------------------------------ lineage
def test_a_subagent_and_a_compaction_get_their_own_conversations(proxy: Proxy) -> None:
    harness = proxy.open("lineage")
    main: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix"}]
    sub: list[dict[str, Any]] = [{"role": "system", "content": "You search code."}, {"role": "user", "content": "Find"}]

    def step(messages: list[dict[str, Any]], output: str) -> None:
        reply = harness.chat(messages)["choices"][0]["message"]
        call_id = (reply.get("tool_calls") or [{"id": "none"}])[0]["id"]
        messages += [reply, tool_result(call_id, output)]

    step(main, "spawned a subagent")  # call 0: main
    step(sub, "grep results")  # call 1: subagent, unrelated prompt
    step(sub, "more results")  # call 2: subagent continues
    step(main, "the subagent found parse()")  # call 3: main continues
    compacted = [*main[:2], {"role": "user", "content": "Summary so far: parse() is broken."}]
    step(compacted, "ok")  # call 4: compaction drops earlier turns
    step(compacted, "ok")  # call 5: continues the compacted context
    step(list(main[:2]), "retry")  # call 6: the original first prompt again (a retry)
    assert proxy.close("lineage").json()["conversations"] == 4
    records, rebuilt = proxy.records("lineage"), PromptReconstructor()
    assert [r["conversation_id"] for r in records] == [0, 1, 1, 0, 2, 2, 3]
    for record in records:
        rebuilt.add_model_call(record)  # every branch rebuilds exactly
    sequences: dict[int, np.ndarray] = {}
    for record in records:
        conversation, prompt = record["conversation_id"], rebuilt.prompt(record["call_index"])
        if conversation in sequences:  # each conversation is one token-exact sequence
            assert prompt[: len(sequences[conversation])].tolist() == sequences[conversation].tolist()
        sequences[conversation] = rebuilt.sequence(record["call_index"])


# ------------------------------------------------------------------------------------------------ concurrency
def test_concurrent_episodes_are_all_recorded_in_order(proxy: Proxy, backend: BackgroundServer) -> None:
    episodes = 16
    tokens = {f"conc-{i}": proxy.open(f"conc-{i}").client.headers["authorization"] for i in range(episodes)}

    async def episode(client: httpx.AsyncClient, episode_id: str, stream: bool) -> None:
        headers = {"authorization": tokens[episode_id]}
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task of {episode_id}"}]
        for _ in range(3):
            body = {"model": "policy", "messages": messages, "tools": TOOLS, "stream": stream}
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            answer = assemble("/chat/completions", response.text) if stream else response.json()
            reply = answer["choices"][0]["message"]
            messages += [reply, tool_result((reply.get("tool_calls") or [{"id": "-"}])[0]["id"], "ok")]

    async def run_all() -> None:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            await asyncio.gather(*(episode(client, eid, i % 2 == 0) for i, eid in enumerate(tokens)))

    asyncio.run(run_all())
    assert [proxy.close(episode_id).json()["calls_recorded"] for episode_id in tokens] == [3] * episodes
    everything = proxy.records()
    for episode_id in tokens:
        records, rebuilt = [r for r in everything if r["episode_id"] == episode_id], PromptReconstructor()
        assert [(r["call_index"], r["conversation_id"]) for r in records] == [(0, 0), (1, 0), (2, 0)]
        for record in records:
            rebuilt.add_model_call(record)
        assert [r["response_text"] for r in records] == ["Looking around.", "", "Fixed: parse() now strips whitespace."]


def test_parallel_calls_of_one_episode_are_each_recorded(proxy: Proxy) -> None:
    harness = proxy.open("parallel")
    token = harness.client.headers["authorization"]

    async def subagent(client: httpx.AsyncClient, n: int) -> int:
        messages = [{"role": "system", "content": f"subagent {n}"}, {"role": "user", "content": "go"}]
        body = {"model": "policy", "messages": messages, "stream": n % 2 == 1}
        response = await client.post("/v1/chat/completions", json=body, headers={"authorization": token})
        return response.status_code

    async def run_all() -> list[int]:
        async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as client:
            return await asyncio.gather(*(subagent(client, n) for n in range(8)))

    assert asyncio.run(run_all()) == [200] * 8
    assert proxy.close("parallel").json()["calls_recorded"] == 8
    records, rebuilt = proxy.records("parallel"), PromptReconstructor()
    assert [(r["call_index"], r["conversation_id"]) for r in records] == [(i, i) for i in range(8)]
    for record in records:
        rebuilt.add_model_call(record)


def test_closing_waits_for_calls_in_flight_and_drops_those_that_outlive_the_drain(
    start_proxy: Callable[..., Proxy],
) -> None:
    plan = ScriptedPlan(steps=[ScriptedStep(text="slow", delay_s=0.4)] * 4)
    with BackgroundServer(create_scripted_app(plan), timeout_graceful_shutdown=0.1) as slow:
        body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
        for drain_timeout_s, recorded in ((10.0, 1), (0.05, 0)):
            proxy = start_proxy(backend_base_url=f"{slow.url}/v1", drain_timeout_s=drain_timeout_s)
            harness = proxy.open(f"in-flight-{recorded}")
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(harness.client.post, "/chat/completions", json=body)
                while proxy.admin.get(f"/admin/episodes/{harness.episode_id}").json()["calls_in_flight"] == 0:
                    time.sleep(0.01)
                summary = proxy.close(harness.episode_id).json()
                assert answer.result(10).status_code == 200  # the harness got its answer either way
            assert summary["calls_recorded"] == recorded
            time.sleep(0.1)  # a dropped call is not recorded later either
            assert len(proxy.records()) == recorded


def test_an_expired_episode_the_env_never_closed_is_closed_after_its_grace(
    start_proxy: Callable[..., Proxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("producers.proxy.app.REAP_INTERVAL_S", 0.05)
    proxy = start_proxy(expired_grace_s=0.1)
    harness = proxy.open("forgotten", ttl_s=0.3)
    harness.chat([{"role": "user", "content": "hi"}])
    deadline = time.monotonic() + 5
    while (summary := proxy.admin.get("/admin/episodes/forgotten").json())["state"] != "closed":
        assert time.monotonic() < deadline, summary
        time.sleep(0.05)
    assert summary["calls_recorded"] == 1
    assert len(proxy.records("forgotten")) == 1


# ------------------------------------------------------------------------------------------------ the backend pool
RAW_ANSWERS = {
    "/length": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"],
    "/chunked": [  # split mid-header, mid-chunk and mid-terminator; a chunk extension and a trailer
        b"HTTP/1.1 200 OK\r\nTransfer-Enc", b"oding: chunked\r\n\r\n5;ext=1\r\nhel", b"lo\r", b"\n6\r\n wo",
        b"rld\r\n0\r\nX-Trailer: 1\r\n\r\n",
    ],
    "/continue": [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"],
    "/empty": [b"HTTP/1.1 204 No Content\r\n\r\n"],
    "/close": [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"],
    "/slow": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n", b"PAUSE"],
}  # fmt: skip


class RawBackend:
    """An HTTP/1.1 server answering each path with fixed bytes (``RAW_ANSWERS``), written piece by piece; it counts
    connections, and ``/drop-next`` makes it close the connection on the next request without answering."""

    def __init__(self) -> None:
        self.connections = 0
        self.drop_next = False
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next((int(v) for k, _, v in (x.partition(": ") for x in lines) if k == "content-length"), 0)
                body = await reader.readexactly(length)
                path = lines[0].split(" ")[1]
                if self.drop_next:
                    self.drop_next = False
                    break
                if path == "/echo":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                for piece in RAW_ANSWERS.get(path, []):
                    if piece == b"PAUSE":
                        await asyncio.sleep(5)
                        break
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.01)
                if path == "/close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def with_raw_backend(scenario: Callable[[RawBackend, Any], Any]) -> Any:
    """Run ``scenario(server, pool)`` against a ``RawBackend`` on loopback."""
    from producers.proxy.upstream import UpstreamPool

    server = RawBackend()
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    pool = UpstreamPool(f"http://127.0.0.1:{server.port}", headers={"content-type": "application/json"})
    try:
        return await scenario(server, pool)
    finally:
        await pool.aclose()
        listener.close()
        await listener.wait_closed()


def test_the_backend_pool_reads_every_body_framing_and_keeps_connections_alive() -> None:
    async def scenario(server: RawBackend, pool: Any) -> None:
        async def fetch(path: str, body: bytes = b"") -> tuple[int, bytes]:
            response = await pool.request("POST" if body else "GET", path, body)
            return response.status, await response.read()

        assert await fetch("/length") == (200, b"hello")
        assert await fetch("/chunked") == (200, b"hello world")
        assert await fetch("/continue") == (200, b"ok")
        assert await fetch("/empty") == (204, b"")
        big = json.dumps({"x": "y" * 200_000}).encode()
        assert await fetch("/echo", big) == (200, big)
        assert server.connections == 1  # one keep-alive connection so far
        assert await fetch("/close") == (200, b"until the end")
        assert await fetch("/length") == (200, b"hello")
        assert server.connections == 2  # the closed one was not reused

    asyncio.run(with_raw_backend(scenario))


def test_a_pooled_connection_the_backend_dropped_is_replaced_and_a_stalled_stream_times_out() -> None:
    from producers.proxy.upstream import UpstreamError, UpstreamPool

    async def scenario(server: RawBackend, pool: Any) -> None:
        assert await (await pool.request("GET", "/length")).read() == b"hello"
        server.drop_next = True  # the pooled connection dies as the request is sent: it goes again, on a new one
        assert await (await pool.request("GET", "/length")).read() == b"hello"
        assert server.connections == 2
        response = await pool.request("GET", "/slow")
        pieces = []
        with pytest.raises(TimeoutError):
            async for piece in response.stream(0.3):
                pieces.append(piece)
        await response.aclose()
        assert pieces == [b"one"]
        assert await (await pool.request("GET", "/length")).read() == b"hello"  # the stalled one was not reused
        assert server.connections == 3

    asyncio.run(with_raw_backend(scenario))

    async def refused() -> None:
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with pytest.raises(UpstreamError, match="cannot connect"):
            await UpstreamPool(f"http://127.0.0.1:{port}").request("GET", "/models")

    asyncio.run(refused())


# ------------------------------------------------------------------------------------------------ canonical turns
CANONICAL_PLAN = ScriptedPlan(
    steps=[
        ScriptedStep(
            text="Looking around.", tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "ls -la", "cwd": "/"})]
        ),
        ScriptedStep(tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "cat a.py", "timeout": 5})]),
        ScriptedStep(
            text="Running  the\ntests.", tool_calls=[ScriptedToolCall(name="shell", arguments={"cmd": "pytest"})]
        ),
        ScriptedStep(text="Fixed."),
    ]
)


@pytest.fixture(scope="module")
def canonical_backend() -> Iterator[BackgroundServer]:
    """A scripted backend whose tool calls carry spaced JSON arguments with several keys."""
    with BackgroundServer(create_scripted_app(CANONICAL_PLAN, POLICY_VERSION)) as server:
        yield server


def reserialized(message: dict[str, Any], how: str) -> dict[str, Any]:
    """An assistant message as a harness re-serialises it: the same turn, other bytes."""
    out = dict(message)
    calls = [dict(call, function=dict(call["function"])) for call in message.get("tool_calls") or []]
    for call in calls:
        arguments = json.loads(call["function"]["arguments"])
        if how == "compact":  # opencode
            call["function"]["arguments"] = json.dumps(arguments, separators=(",", ":"))
        elif how == "reordered":
            call["function"]["arguments"] = json.dumps(dict(reversed(arguments.items())), indent=2)
    if calls:
        out["tool_calls"] = calls
    if how == "whitespace":
        out["content"] = " ".join((message["content"] or "").split()) + "\n" if message["content"] else ""
    return out


def assert_one_conversation(proxy: Proxy, episode_id: str, calls: int) -> PromptReconstructor:
    """Every call continues the previous one token for token; returns the rebuilt episode."""
    records, rebuilt = proxy.records(episode_id), PromptReconstructor()
    assert [r["conversation_id"] for r in records] == [0] * calls
    for record in records:
        rebuilt.add_model_call(record)
    for index in range(1, calls):
        previous = rebuilt.sequence(index - 1).tolist()
        assert rebuilt.prompt(index)[: len(previous)].tolist() == previous
    return rebuilt


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_re_serialised_turns_are_forwarded_as_sampled(
    start_proxy: Callable[..., Proxy], canonical_backend: BackgroundServer, stream: bool
) -> None:
    proxy = start_proxy(backend_base_url=f"{canonical_backend.url}/v1")
    harness = proxy.open(f"canonical-{stream}")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix"}]
    sampled: list[dict[str, Any]] = list(history)  # the history as the engine sampled it
    ways = ["compact", "reordered", "whitespace"]
    for output, how in zip(["a.py", "def parse(): ...", "1 failed"], ways, strict=True):
        reply = harness.chat(history, stream)["choices"][0]["message"]
        result = tool_result(reply["tool_calls"][0]["id"], output)
        sampled += [reply, result]
        history = [reserialized(m, how) if m["role"] == "assistant" else m for m in history] + [
            reserialized(reply, how),
            result,
        ]
    assert history != sampled
    harness.chat(history, stream)
    summary = proxy.close(harness.episode_id).json()
    assert (summary["calls_recorded"], summary["conversations"], summary["canonicalized_calls"]) == (4, 1, 3)
    rebuilt = assert_one_conversation(proxy, harness.episode_id, 4)
    # each record names the assistant turns it put back as sampled (every one the harness re-serialised)
    canonicalized = [r["canonicalized_messages"] for r in proxy.records(harness.episode_id)]
    assert canonicalized == [[], [2], [2, 4], [2, 4, 6]]
    body = {"model": "policy", "messages": sampled, "tools": TOOLS, "temperature": 0.7}
    expected = direct_trace(canonical_backend, "/chat/completions", body, f"direct-canonical-{stream}")
    assert rebuilt.prompt(3).tolist() == expected.prompt_token_ids  # the engine was shown what it sampled
    assert rebuilt.messages(3) == sampled  # and the record says so


def test_an_edited_turn_is_not_canonicalised(
    start_proxy: Callable[..., Proxy], canonical_backend: BackgroundServer
) -> None:
    proxy = start_proxy(backend_base_url=f"{canonical_backend.url}/v1")
    harness = proxy.open("edited")
    history: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix"}]
    reply = harness.chat(history)["choices"][0]["message"]
    edited_text = reply | {"content": "I looked around."}
    call = reply["tool_calls"][0]
    edited_args = reply | {
        "tool_calls": [call | {"function": {"name": "shell", "arguments": '{"cmd": "ls", "cwd": "/"}'}}]
    }
    for edited in (edited_text, edited_args):
        harness.chat([*history, edited, tool_result(call["id"], "a.py")])
    summary = proxy.close("edited").json()
    assert (summary["conversations"], summary["canonicalized_calls"]) == (3, 0)
    records, rebuilt = proxy.records("edited"), PromptReconstructor()
    assert [r["conversation_id"] for r in records] == [0, 1, 2]
    assert [r["canonicalized_messages"] for r in records] == [[], [], []]
    for record in records:
        rebuilt.add_model_call(record)
    assert [rebuilt.messages(index)[2] for index in (1, 2)] == [edited_text, edited_args]  # forwarded as sent


REASONING_REPLY = {
    "role": "assistant",
    "content": "Listing.",
    "reasoning_content": "The user wants the files first.",
    "tool_calls": [{"id": "call_r", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "ls"}'}}],
}


def rendered_with_reasoning(messages: list[dict[str, Any]]) -> list[int]:
    """A template that renders each message's content, reasoning and tool calls, one line each."""
    keys = ("role", "content", "reasoning_content", "tool_calls")
    lines = [json.dumps({key: message.get(key) for key in keys}, sort_keys=True) + "\n" for message in messages]
    return [token for line in lines for token in encode_text(line)]


@pytest.fixture(scope="module")
def reasoning_backend() -> Iterator[BackgroundServer]:
    """A backend answering with a reasoning block (then plain text once a tool result came), rendering reasoning."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        messages = (await request.json())["messages"]
        done = any(message["role"] == "tool" for message in messages)
        reply = {"role": "assistant", "content": "Done."} if done else REASONING_REPLY
        completion = rendered_with_reasoning([reply])
        trace = TokenTrace(
            prompt_token_ids=rendered_with_reasoning(messages),
            completion_token_ids=completion,
            completion_logprobs=[0.0] * len(completion),
            policy_version=1,
        )
        choice = {"index": 0, "message": reply, "finish_reason": "stop" if done else "tool_calls"}
        return JSONResponse({"id": "x", "object": "chat.completion", "choices": [choice], **trace.as_field()})

    with BackgroundServer(app) as server:
        yield server


def test_a_dropped_reasoning_block_is_restored(
    start_proxy: Callable[..., Proxy], reasoning_backend: BackgroundServer
) -> None:
    proxy = start_proxy(backend_base_url=f"{reasoning_backend.url}/v1")
    harness = proxy.open("reasoning")
    history: list[dict[str, Any]] = [{"role": "user", "content": "Fix"}]
    reply = harness.chat(history)["choices"][0]["message"]
    assert reply == REASONING_REPLY
    dropped = reserialized({k: v for k, v in reply.items() if k != "reasoning_content"}, "compact")
    harness.chat([*history, dropped, tool_result("call_r", "a.py")])
    summary = proxy.close("reasoning").json()
    assert (summary["conversations"], summary["canonicalized_calls"]) == (1, 1)
    rebuilt = assert_one_conversation(proxy, "reasoning", 2)
    assert rebuilt.messages(1) == [*history, REASONING_REPLY, tool_result("call_r", "a.py")]
