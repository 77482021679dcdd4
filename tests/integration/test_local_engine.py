"""The local engine end to end: real uvicorn on loopback, CPU, tiny models built in the test.

What is checked, and how:

- the four ways to ask (chat, responses, each streamed or not) give the same token ids, logprobs and text for one
  seed, and the trace sits exactly where ``orchard.engines.token_trace`` says;
- reported logprobs are the raw model logprobs: equal (to 1e-4) to ``log_softmax`` of one unpadded forward pass
  at the sampled tokens, and not the temperature-scaled ones;
- tool calls: a tiny model fine-tuned in the test to answer one question with a ``<tool_call>`` block is served,
  and its *real output* becomes an OpenAI ``tool_calls`` entry (chat, streamed chat) and a ``function_call`` item
  (responses); sending the call and the tool result back yields a prompt that extends the previous prompt and
  completion token for token;
- concurrent requests run in one batch (the scheduler's step sizes), and each batched completion still matches a
  direct forward pass;
- a full queue answers 503; bad input answers OpenAI errors with the field named;
- hot reload under load (embedded bus, local store, ``publish_policy_version``): every streamed request completes,
  each client sees version 0 then 1, every trace's logprobs match the weights of the version it names, and a
  request that started on version 0 finished on it after the swap; a tampered and a partial artifact are refused
  while the previous version keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from orchard.artifacts import policy_artifact_name
from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.exceptions import EngineError
from orchard.engines.local import LocalEngine
from orchard.engines.openai_api import create_engine_app
from orchard.engines.reload import IN_MEMORY_BYTES, PolicyReloader
from orchard.engines.server import serve_in_thread
from orchard.engines.tiny import TOKENIZER_REVISION, build_tiny_checkpoint
from orchard.engines.token_trace import TokenTrace, trace_of
from orchard.store import open_store
from orchard.topics import POLICY_VERSIONS
from trainers.weights import publish_policy_version

MODEL = "tiny-llama"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------------- helpers
async def stream_events(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
    """The ``data:`` payloads of a streamed answer, decoded (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    async with client.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat_stream_result(events: list[Any]) -> tuple[str, TokenTrace, list[dict[str, Any]]]:
    """Text, trace and tool-call deltas of a streamed chat completion; the trace is on the last chunk only."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [trace_of(c) is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls", [])]
    trace = trace_of(chunks[-1])
    assert trace is not None
    return text, trace, calls


def responses_stream_result(events: list[Any]) -> tuple[str, TokenTrace, dict[str, Any]]:
    """Streamed text, trace and final response of a streamed response; the trace only in ``response.completed``."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    assert all(trace_of(e) is None and trace_of(e.get("response", {})) is None for e in events[:-1])
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    final = events[-1]["response"]
    trace = trace_of(final)
    assert trace is not None
    return text, trace, final


def load_reference(path: Path) -> PreTrainedModel:
    """The checkpoint loaded plainly, for direct forward passes."""
    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(path).eval()


@torch.inference_mode()
def direct_logits(model: PreTrainedModel, trace: TokenTrace) -> torch.Tensor:
    """Logits predicting each completion token, from one unpadded forward pass over prompt + completion."""
    ids = trace.prompt_token_ids + trace.completion_token_ids[:-1]
    logits = model(torch.tensor([ids])).logits[0].float()
    return logits[len(trace.prompt_token_ids) - 1 :]


def direct_logprobs(model: PreTrainedModel, trace: TokenTrace, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax`` of the direct logits (divided by ``temperature``) at the sampled tokens."""
    tokens = torch.tensor(trace.completion_token_ids).unsqueeze(1)
    return torch.log_softmax(direct_logits(model, trace) / temperature, -1).gather(1, tokens).squeeze(1)


def assert_same_traces(*traces: TokenTrace | None) -> None:
    """Token for token the same; logprobs the same to float precision (a repeated prompt is prefilled from the prefix
    cache, whose keys came from another pass, so the last bits of its logprobs may differ)."""
    assert all(trace is not None for trace in traces)
    first = traces[0]
    assert first is not None
    for trace in traces[1:]:
        assert trace is not None
        assert (trace.prompt_token_ids, trace.completion_token_ids, trace.policy_version) == (
            first.prompt_token_ids,
            first.completion_token_ids,
            first.policy_version,
        )
        torch.testing.assert_close(
            torch.tensor(trace.completion_logprobs), torch.tensor(first.completion_logprobs), atol=1e-5, rtol=0
        )


def assert_logprobs_match(model: PreTrainedModel, trace: TokenTrace) -> None:
    torch.testing.assert_close(
        torch.tensor(trace.completion_logprobs), direct_logprobs(model, trace), atol=1e-4, rtol=0
    )


def build_tool_caller(dest: Path, max_steps: int = 300) -> Path:
    """tiny-llama-micro fine-tuned (overfit) to answer ``TOOL_QUESTION`` with ``TOOL_CALL_TEXT`` + end of turn.

    A random-init model never writes a tool call by chance; a few hundred Adam steps on the one conversation make
    greedy decoding produce exactly the call, so the engine's tool-call path runs on real model output.
    """
    build_tiny_checkpoint("tiny-llama-micro", dest, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(dest)
    model = load_reference(dest)
    rendered = tokenizer.apply_chat_template(TOOL_QUESTION, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    target = tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.005:
            break
    model.eval().save_pretrained(dest)
    return dest


def checkpoint_files(directory: Path) -> dict[str, Path]:
    """Every file of a checkpoint directory, as ``publish_policy_version`` takes them."""
    return {p.name: p for p in sorted(directory.iterdir()) if p.is_file()}


class CapturingProducer:
    """Stands in for a producer to keep a ``PolicyVersion`` record back (to tamper with the store before it goes)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append((topic, value, key))


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def _single_cpu_thread() -> Iterator[None]:
    """Engines here run with one torch thread (``cpu_threads=1``: fast and steady on a shared 2-core machine);
    the process-wide setting is restored for the tests after this module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {f"v{seed}": build_tiny_checkpoint(MODEL, root / f"seed{seed}", seed=seed) for seed in (0, 1, 2)}


@pytest.fixture(scope="module")
def reference(checkpoints: dict[str, Path]) -> PreTrainedModel:
    return load_reference(checkpoints["v0"])


@pytest.fixture(scope="module")
def engine(checkpoints: dict[str, Path]) -> LocalEngine:
    return LocalEngine(
        checkpoints["v0"], model_name=MODEL, max_batch_size=16, max_queue=64, max_context=512, cpu_threads=1
    )


@pytest.fixture(scope="module")
def base_url(engine: LocalEngine) -> Iterator[str]:
    with serve_in_thread(create_engine_app(engine)) as url:
        yield url


def client(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, timeout=120)


# ---------------------------------------------------------------------------------------------------- tests
@pytest.mark.asyncio
async def test_chat_responses_and_streaming_agree(base_url: str) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]
    sampling = {"model": MODEL, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    async with client(base_url) as http:
        chat = (await http.post(CHAT, json=sampling | {"messages": messages, "max_tokens": 24})).json()
        chat_events = await stream_events(http, CHAT, sampling | {"messages": messages, "max_tokens": 24})
        response = (await http.post(RESPONSES, json=sampling | {"input": messages, "max_output_tokens": 24})).json()
        response_events = await stream_events(http, RESPONSES, sampling | {"input": messages, "max_output_tokens": 24})
    chat_text, chat_trace, _ = chat_stream_result(chat_events)
    response_text, response_trace, streamed_response = responses_stream_result(response_events)
    traces = [trace_of(chat), chat_trace, trace_of(response), response_trace]
    assert_same_traces(*traces)
    assert len(traces[0].completion_token_ids) == 24
    texts = [
        chat["choices"][0]["message"]["content"],
        chat_text,
        response["output"][0]["content"][0]["text"],
        response_text,
        streamed_response["output"][0]["content"][0]["text"],
    ]
    assert texts == [texts[0]] * 5
    assert chat["choices"][0]["finish_reason"] == "length"
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert chat["usage"] == {
        "prompt_tokens": len(traces[0].prompt_token_ids),
        "completion_tokens": 24,
        "total_tokens": len(traces[0].prompt_token_ids) + 24,
    }


@pytest.mark.asyncio
async def test_a_follow_up_call_is_prefilled_from_the_prefix_cache_and_its_logprobs_are_the_weights(
    base_url: str, reference: PreTrainedModel
) -> None:
    system = {"role": "system", "content": "You are a careful agent; read the files before you answer. " * 4}
    first_turn = [system, {"role": "user", "content": "Which file names the key?"}]
    body = {"model": MODEL, "max_tokens": 12, "temperature": 0}
    async with client(base_url) as http:
        reused_before = (await http.get("/healthz")).json()["reused_tokens"]
        first = (await http.post(CHAT, json=body | {"messages": first_turn})).json()
        answer = {"role": "assistant", "content": first["choices"][0]["message"]["content"] or "..."}
        follow_up = first_turn + [answer, {"role": "user", "content": "Now write it down."}]
        second = (await http.post(CHAT, json=body | {"messages": follow_up})).json()
        reused = (await http.get("/healthz")).json()["reused_tokens"] - reused_before
    first_trace, second_trace = trace_of(first), trace_of(second)
    assert first_trace is not None and second_trace is not None
    assert reused >= len(first_trace.prompt_token_ids) - 1  # at least the whole first prompt came from the cache
    assert_logprobs_match(reference, second_trace)


@pytest.mark.asyncio
async def test_n_choices_each_carry_a_trace(base_url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "n": 3, "seed": 5}
    async with client(base_url) as http:
        first, again = [(await http.post(CHAT, json=body)).json() for _ in range(2)]
    assert trace_of(first) is None
    traces = [trace_of(choice) for choice in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert len({tuple(t.completion_token_ids) for t in traces}) == 3  # the choices differ...
    for choice, trace in zip(again["choices"], traces, strict=True):  # ...and the seed reproduces them
        assert_same_traces(trace_of(choice), trace)


@pytest.mark.asyncio
async def test_stop_string_cuts_text_but_keeps_the_sampled_tokens(base_url: str, engine: LocalEngine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Stop me."}], "max_tokens": 24, "temperature": 0}
    async with client(base_url) as http:
        free = (await http.post(CHAT, json=body)).json()
        text = free["choices"][0]["message"]["content"]
        stop = text[6:9]
        stopped = (await http.post(CHAT, json=body | {"stop": [stop]})).json()
        streamed, streamed_trace, _ = chat_stream_result(await stream_events(http, CHAT, body | {"stop": stop}))
    cut = text[: text.find(stop)]
    assert (stopped["choices"][0]["message"]["content"], streamed) == (cut, cut)
    assert stopped["choices"][0]["finish_reason"] == "stop"
    ids = trace_of(stopped).completion_token_ids
    assert ids == trace_of(free).completion_token_ids[: len(ids)]
    assert_same_traces(streamed_trace, trace_of(stopped))
    assert stop in engine.tokenizer.decode(ids)  # the tokens that completed the stop string were sampled, and kept


@pytest.mark.asyncio
async def test_logprobs_are_raw_model_logprobs(base_url: str, reference: PreTrainedModel) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 32}
    async with client(base_url) as http:
        answer = (await http.post(CHAT, json=body | {"temperature": 0.7, "top_p": 0.9, "seed": 7})).json()
    trace = trace_of(answer)
    assert trace is not None and len(trace.completion_token_ids) > 1
    assert_logprobs_match(reference, trace)
    scaled = direct_logprobs(reference, trace, temperature=0.7)
    assert (scaled - torch.tensor(trace.completion_logprobs)).abs().max() > 0.05  # not the temperature-scaled ones


@pytest.mark.asyncio
async def test_concurrent_requests_are_batched(base_url: str, engine: LocalEngine, reference: PreTrainedModel) -> None:
    before = sum(count for size, count in engine.scheduler.stats.batch_sizes.items() if size > 1)
    prompts = [f"Request number {i}: " + "tell me more. " * i for i in range(8)]
    async with client(base_url) as http:
        answers = await asyncio.gather(
            *(
                http.post(
                    CHAT,
                    json={
                        "model": MODEL,
                        "messages": [{"role": "user", "content": p}],
                        "max_tokens": 12,
                        "temperature": 0,
                    },
                )
                for p in prompts
            )
        )
    assert [a.status_code for a in answers] == [200] * 8
    after = sum(count for size, count in engine.scheduler.stats.batch_sizes.items() if size > 1)
    assert after > before
    assert engine.scheduler.stats.max_batch > 1
    for answer in answers:
        trace = trace_of(answer.json())
        assert trace is not None
        assert_logprobs_match(reference, trace)
        logits = direct_logits(reference, trace)
        top2 = logits.topk(2).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4  # greedy must be the argmax wherever it is not a near-tie
        assert torch.equal(logits.argmax(-1)[clear], torch.tensor(trace.completion_token_ids)[clear])


@pytest.mark.asyncio
async def test_a_client_that_goes_away_stops_its_generation(base_url: str, engine: LocalEngine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Go on."}], "max_tokens": 480, "stream": True}
    steps = engine.scheduler.stats.steps
    async with client(base_url) as http, http.stream("POST", CHAT, json=body) as response:
        lines = response.aiter_lines()
        while not (await anext(lines)).startswith("data: "):
            pass
        await _until(lambda: engine.scheduler.running == 1, timeout_s=5)  # the first line may precede admission
    await _until(lambda: engine.scheduler.running == 0, timeout_s=10)
    assert engine.scheduler.stats.steps - steps < 400  # dropped long before its 480 tokens


@pytest.mark.asyncio
async def test_bad_input_gets_openai_errors(base_url: str) -> None:
    user = [{"role": "user", "content": "Hi"}]
    cases = [
        ({"model": "gpt-4o", "messages": user}, 404, "model", "model_not_found"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "word " * 600}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        ({"model": MODEL, "messages": user, "max_tokens": 600}, 400, "max_tokens", "context_length_exceeded"),
        (
            {
                "model": MODEL,
                "messages": user,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            },
            400,
            "tools[0].function.parameters",
            "invalid_request",
        ),
        ({"model": MODEL, "messages": user, "tools": "get_weather"}, 400, "tools", "invalid_request"),
        ({"model": MODEL, "messages": user, "n": 2, "stream": True}, 400, "n", "invalid_request"),
    ]
    async with client(base_url) as http:
        for body, status, param, code in cases:
            answer = await http.post(CHAT, json=body)
            error = answer.json()["error"]
            assert (answer.status_code, error["param"], error["code"]) == (status, param, code), error
            assert error["type"] == "invalid_request_error" and error["message"]
        unknown_tool = await http.post(
            RESPONSES, json={"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}
        )
        not_json = await http.post(CHAT, content=b"{nope", headers={"content-type": "application/json"})
        still_fine = await http.post(CHAT, json={"model": MODEL, "messages": user, "max_tokens": 2})
    assert unknown_tool.json() == {
        "error": {
            "message": "tools[0]: only function tools are supported, not 'web_search'",
            "type": "invalid_request_error",
            "param": "tools[0]",
            "code": "invalid_request",
        }
    }
    assert (not_json.status_code, not_json.json()["error"]["code"]) == (400, "invalid_request")
    assert still_fine.status_code == 200


@pytest.mark.asyncio
async def test_tokenize_answers_the_prompt_a_chat_request_renders_to(base_url: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count me."}], "max_tokens": 4}
    async with client(base_url) as http:
        counted = (await http.post("/v1/tokenize", json=body)).json()
        trace = trace_of((await http.post(CHAT, json=body)).json())
        unknown = await http.post("/v1/tokenize", json=body | {"model": "nope"})
    assert trace is not None
    assert counted == {"count": len(trace.prompt_token_ids), "max_model_len": 512, "tokens": trace.prompt_token_ids}
    assert unknown.status_code == 404


@pytest.mark.asyncio
async def test_models_and_health(base_url: str) -> None:
    async with client(base_url) as http:
        models = (await http.get("/v1/models")).json()
        health = (await http.get("/healthz")).json()
    assert models == {
        "object": "list",
        "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "orchard", "max_model_len": 512}],
    }
    assert (health["status"], health["model"], health["policy_version"]) == ("ok", MODEL, 0)


@pytest.mark.asyncio
async def test_queue_full_answers_503(checkpoints: dict[str, Path]) -> None:
    engine = LocalEngine(checkpoints["v0"], model_name=MODEL, max_batch_size=1, max_queue=1, cpu_threads=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
    with serve_in_thread(create_engine_app(engine)) as url:
        async with client(url) as http:
            running = asyncio.create_task(http.post(CHAT, json=body | {"max_tokens": 400}))
            await _until(lambda: engine.scheduler.running == 1)
            queued = asyncio.create_task(http.post(CHAT, json=body | {"max_tokens": 2}))
            await _until(lambda: engine.scheduler.waiting == 1)
            refused = await http.post(CHAT, json=body | {"max_tokens": 2})
            done = await asyncio.gather(running, queued)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json() == {
        "error": {
            "message": "the request queue is full (1 waiting); retry later",
            "type": "server_error",
            "param": None,
            "code": "engine_overloaded",
        }
    }
    assert [d.status_code for d in done] == [200, 200]


@pytest.mark.asyncio
async def test_tool_call_round_trip(tmp_path: Path) -> None:
    checkpoint = build_tool_caller(tmp_path / "tool-caller")
    engine = LocalEngine(checkpoint, model_name="tool-caller", cpu_threads=1)
    base = {"model": "tool-caller", "tools": TOOLS, "temperature": 0, "max_tokens": 64}
    with serve_in_thread(create_engine_app(engine)) as url:
        async with client(url) as http:
            chat = (await http.post(CHAT, json=base | {"messages": TOOL_QUESTION})).json()
            streamed = chat_stream_result(await stream_events(http, CHAT, base | {"messages": TOOL_QUESTION}))
            responses_body = {
                "model": "tool-caller",
                "tools": [{"type": "function", **TOOLS[0]["function"]}],
                "input": TOOL_QUESTION,
                "temperature": 0,
            }
            response = (await http.post(RESPONSES, json=responses_body)).json()
            untooled = (await http.post(CHAT, json=base | {"messages": TOOL_QUESTION, "tool_choice": "none"})).json()
            call = chat["choices"][0]["message"]["tool_calls"][0]
            follow_up = base | {
                "messages": [
                    *TOOL_QUESTION,
                    chat["choices"][0]["message"],
                    {"role": "tool", "tool_call_id": call["id"], "content": "21 C and sunny"},
                ],
                "max_tokens": 2,
            }
            second = (await http.post(CHAT, json=follow_up)).json()
    message = chat["choices"][0]["message"]
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert call["type"] == "function" and call["id"].startswith("call_")
    first = trace_of(chat)
    tokenizer = engine.tokenizer
    assert tokenizer.decode(first.completion_token_ids) == TOOL_CALL_TEXT + "<|im_end|>"

    text, streamed_trace, streamed_calls = streamed
    assert text == ""
    assert_same_traces(streamed_trace, first)
    assert [(c["index"], c["function"]) for c in streamed_calls] == [(0, message["tool_calls"][0]["function"])]

    items = response["output"]
    assert [(i["type"], i["name"], i["arguments"]) for i in items] == [
        ("function_call", "get_weather", '{"city": "Paris"}')
    ]
    assert untooled["choices"][0]["message"] == {"role": "assistant", "content": TOOL_CALL_TEXT}

    # the call and its result rendered back: the new prompt extends the old prompt and completion token for token
    prompt = trace_of(second).prompt_token_ids
    assert prompt[: len(first.prompt_token_ids) + len(first.completion_token_ids)] == (
        first.prompt_token_ids + first.completion_token_ids
    )
    rest = tokenizer.decode(prompt[len(first.prompt_token_ids) + len(first.completion_token_ids) :])
    assert rest == "\n<|im_start|>tool\n21 C and sunny<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.asyncio
async def test_hot_reload_under_load(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    producer = bus.producer()
    engine = LocalEngine(checkpoints["v0"], model_name=MODEL, max_batch_size=16, cpu_threads=1)
    reloader = PolicyReloader(engine, bus, store, run_id="r1", model="policy", poll_timeout_s=0.1)
    models = {0: load_reference(checkpoints["v0"]), 1: load_reference(checkpoints["v1"])}
    results: list[tuple[int, float, float, TokenTrace]] = []
    stop = asyncio.Event()

    async def client_loop(http: httpx.AsyncClient, worker: int) -> None:
        for k in range(1000):
            if stop.is_set():
                return
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"client {worker} call {k}"}],
                # lengths differ per client: equal lengths keep the tiny model's clients in lockstep (it seldom
                # stops early), and a swap that lands between two lockstep rounds finds nothing in flight
                "max_tokens": 16 + 12 * worker,
                "seed": worker * 1000 + k,
            }
            started = time.time()
            _, trace, _ = chat_stream_result(await stream_events(http, CHAT, body))
            results.append((worker, started, time.time(), trace))

    with serve_in_thread(create_engine_app(engine, reloader=reloader)) as url:
        async with client(url) as http:
            clients = [asyncio.create_task(client_loop(http, w)) for w in range(6)]
            await _until(lambda: len(results) >= 6)
            await asyncio.to_thread(
                publish_policy_version,
                store,
                producer,
                run_id="r1",
                model="policy",
                version=1,
                files=checkpoint_files(checkpoints["v1"]),
                trainer_step=10,
            )
            await _until(lambda: sum(r[3].policy_version == 1 for r in results) >= 6)
            stop.set()
            await asyncio.gather(*clients)
    swapped_at = engine.scheduler.stats.first_token_time[1]
    producer.close()
    bus.close()

    assert reloader.applied == [1] and reloader.refused == []
    for worker in range(6):
        versions = [trace.policy_version for w, _, _, trace in results if w == worker]
        assert versions == sorted(versions), versions  # each client: version 0, then 1
    assert {r[3].policy_version for r in results} == {0, 1}
    for _, _, _, trace in results:  # every request finished on the weights its trace names
        assert 0 < len(trace.completion_token_ids) <= 16 + 12 * 5
        assert_logprobs_match(models[trace.policy_version], trace)
    in_flight = [r for r in results if r[3].policy_version == 0 and r[1] < swapped_at < r[2]]
    assert in_flight, "no request was in flight on version 0 when version 1 was installed"


@pytest.mark.asyncio
@pytest.mark.parametrize("in_memory_bytes", [IN_MEMORY_BYTES, 0], ids=["in-memory", "scratch-directory"])
async def test_corrupt_or_partial_versions_are_refused(
    tmp_path: Path, checkpoints: dict[str, Path], in_memory_bytes: int
) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    producer = bus.producer()
    engine = LocalEngine(checkpoints["v0"], model_name=MODEL, cpu_threads=1)
    reloader = PolicyReloader(
        engine, bus, store, run_id="r1", model="policy", poll_timeout_s=0.1, in_memory_bytes=in_memory_bytes
    )
    v1 = load_reference(checkpoints["v1"])
    publish = {"run_id": "r1", "model": "policy", "trainer_step": 1}
    partial = tmp_path / "partial"
    partial.mkdir()
    weights = load_file(checkpoints["v2"] / "model.safetensors")
    weights.pop("model.layers.1.mlp.up_proj.weight")
    save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
    (partial / "config.json").write_bytes((checkpoints["v2"] / "config.json").read_bytes())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "seed": 1}

    with serve_in_thread(create_engine_app(engine, reloader=reloader)) as url:
        async with client(url) as http:
            publish_policy_version(store, producer, version=1, files=checkpoint_files(checkpoints["v1"]), **publish)
            await _until(lambda: reloader.applied == [1])

            held = CapturingProducer()  # v2: published to the store, tampered there, then announced
            publish_policy_version(store, held, version=2, files=checkpoint_files(checkpoints["v2"]), **publish)
            stored = tmp_path / "store" / policy_artifact_name("r1", "policy") / "v0000000002" / "model.safetensors"
            data = bytearray(stored.read_bytes())
            data[len(data) // 2] ^= 0xFF
            stored.write_bytes(bytes(data))
            for topic, value, key in held.sent:
                producer.send(topic, value, key)
            await _until(lambda: reloader.refused == [2])

            publish_policy_version(store, producer, version=3, files=checkpoint_files(partial), **publish)
            await _until(lambda: reloader.refused == [2, 3])
            after = (await http.post(CHAT, json=body)).json()
    producer.close()
    bus.close()

    assert held.sent and held.sent[0][0] == POLICY_VERSIONS
    assert "expected sha256" in reloader.events[1].reason
    assert "missing_keys" in reloader.events[2].reason and "up_proj" in reloader.events[2].reason
    assert engine.policy_version == 1
    trace = trace_of(after)
    assert trace.policy_version == 1
    assert_logprobs_match(v1, trace)


@pytest.mark.asyncio
async def test_a_pinned_engine_serves_its_version_from_the_first_request_and_never_a_newer_one(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    bus.create_topic(POLICY_VERSIONS, 1)
    producer = bus.producer()
    publish = {"run_id": "r1", "model": "policy", "trainer_step": 1}
    for version, seed in ((1, "v1"), (2, "v2")):  # both published before the engine starts
        publish_policy_version(store, producer, version=version, files=checkpoint_files(checkpoints[seed]), **publish)
    engine = LocalEngine(checkpoints["v0"], model_name=MODEL, cpu_threads=1)
    reloader = PolicyReloader(engine, bus, store, run_id="r1", model="policy", poll_timeout_s=0.1, max_version=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "seed": 1}
    with serve_in_thread(create_engine_app(engine, reloader=reloader)) as url:
        async with client(url) as http:
            first = (await http.post(CHAT, json=body)).json()  # no wait: the pin is installed before serving
            publish_policy_version(store, producer, version=3, files=checkpoint_files(checkpoints["v2"]), **publish)
            await asyncio.sleep(1.0)
            later = (await http.post(CHAT, json=body)).json()
    producer.close()
    bus.close()
    assert reloader.applied == [1] and reloader.refused == []
    assert trace_of(first).policy_version == trace_of(later).policy_version == 1
    assert_logprobs_match(load_reference(checkpoints["v1"]), trace_of(first))


@pytest.mark.asyncio
async def test_a_pinned_engine_takes_the_newest_version_under_its_pin_and_refuses_to_start_without_one(
    tmp_path: Path, checkpoints: dict[str, Path]
) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    bus.create_topic(POLICY_VERSIONS, 1)
    producer = bus.producer()
    publish = {"run_id": "r1", "model": "policy", "trainer_step": 1}

    def pinned(max_version: int) -> PolicyReloader:
        engine = LocalEngine(checkpoints["v0"], model_name=MODEL, cpu_threads=1)
        return PolicyReloader(engine, bus, store, run_id="r1", model="policy", max_version=max_version)

    with pytest.raises(EngineError, match="no version <= 2"):
        pinned(2).start()  # nothing stored yet: it must not serve the base weights as if pinned
    for version, seed in ((1, "v1"), (3, "v2")):
        publish_policy_version(store, producer, version=version, files=checkpoint_files(checkpoints[seed]), **publish)
    reloader = pinned(2)
    reloader.start()
    reloader.stop()
    producer.close()
    bus.close()
    assert reloader.applied == [1] and reloader.engine.policy_version == 1


async def _until(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)


def test_serve_engine_runs_a_tiny_name_in_its_own_process(tmp_path: Path) -> None:
    """What ``orchard engine serve --model tiny-llama-micro`` runs: build the tiny model, serve, reload, stop."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine_config = {
        "model": "tiny-llama-micro",
        "cache_dir": str(tmp_path / "models"),
        "port": port,
        "cpu_threads": 1,
        "policy_updates": {"enabled": True, "poll_timeout_s": 0.1},
    }
    orchard_config = {
        "run_id": "r1",
        "bus": {"type": "embedded", "path": str(tmp_path / "bus")},
        "store": {"type": "local", "path": str(tmp_path / "store")},
    }
    code = (
        "import json, sys\n"
        "from orchard.config import OrchardConfig\n"
        "from orchard.engines.config import EngineConfig\n"
        "from orchard.engines.server import serve_engine\n"
        "serve_engine(EngineConfig.model_validate_json(sys.argv[1]), OrchardConfig(**json.loads(sys.argv[2])))\n"
    )
    argv = [sys.executable, "-c", code, json.dumps(engine_config), json.dumps(orchard_config)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        health = _wait_healthy(url, process)
        body = {"model": "tiny-llama-micro", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        answer = httpx.post(f"{url}{CHAT}", json=body, timeout=60)
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert health["model"] == "tiny-llama-micro" and health["policy_version"] == 0
    assert answer.status_code == 200 and trace_of(answer.json()).policy_version == 0
    assert (tmp_path / "models" / f"tiny-llama-micro-seed0-tok{TOKENIZER_REVISION}" / "config.json").is_file()
    assert process.returncode == 0, stderr.decode()[-2000:]


# Seeds whose tiny-llama reply to "hi" at temperature 1 runs the full 1,500 tokens, alone and four at once.
_FULL_LENGTH_SEEDS = (1, 12, 15, 43)


def test_a_stopped_engine_exits_within_a_supervisors_grace_while_long_generations_run(tmp_path: Path) -> None:
    """SIGTERM with 1,500-token generations in flight: the engine used to finish them all first (92 and 118 s for
    four), past the run supervisor's 10 s grace, and was SIGKILLed; it now fails them after its shutdown grace.
    Unseeded, a generation often ends early at its end-of-text token (all four within 2 s in a CI run), so each asks
    with a seed whose sample runs to ``max_tokens`` with tiny-llama's fixed weights (the engine's per-sequence streams
    do not depend on the batch): the test needs generations still running at the stop."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    orchard = Path(sys.executable).parent / "orchard"
    process = subprocess.Popen([str(orchard), "engine", "serve", "--model", "tiny-llama", "--port", str(port),
                                "--max-context", "4096"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    answers: list[int | str] = []

    def ask(seed: int) -> None:
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500,
                "temperature": 1.0, "seed": seed}  # fmt: skip
        try:
            answers.append(httpx.post(f"{url}{CHAT}", json=body, timeout=180).status_code)
        except httpx.TransportError as exc:
            answers.append(type(exc).__name__)

    try:
        _wait_healthy(url, process)
        askers = [threading.Thread(target=ask, args=(seed,), daemon=True) for seed in _FULL_LENGTH_SEEDS]
        for asker in askers:
            asker.start()
        time.sleep(1)
        running = len(_FULL_LENGTH_SEEDS) - len(answers)
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=150)
        took = time.monotonic() - stopped
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert running > 0, f"every generation ended before the stop: {answers}"
    assert took < 10, f"the engine took {took:.1f}s to stop"


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return dict(httpx.get(f"{url}/healthz", timeout=1).json())
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"the engine did not become healthy (exit code {process.poll()})")


def test_the_tiny_engine_behind_the_recording_proxy_is_recorded_token_exactly(base_url: str, tmp_path: Path) -> None:
    from orchard.bus import open_bus
    from orchard.codec import Codec
    from orchard.config import EmbeddedBusConfig
    from orchard.engines.token_trace import TokenTrace
    from orchard.prefix_delta import PromptReconstructor
    from orchard.tokens import unpack_logprobs, unpack_token_ids
    from orchard.topics import MODEL_CALLS, STANDARD_TOPICS
    from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    admin = "engine-proxy-admin-0123456789"
    proxy = BackgroundServer(create_proxy_app(ProxySettings(backend_base_url=f"{base_url}/v1", admin_token=admin), bus))
    proxy.start()
    headers = {"Authorization": f"Bearer {admin}"}
    traces: list[TokenTrace] = []
    try:
        opening = {"episode_id": "engine-ep", "task_id": "t", "harness": "test", "model": MODEL, "ttl_s": 600}
        token = httpx.post(f"{proxy.url}/admin/episodes", headers=headers, json=opening).json()["token"]
        messages = [{"role": "user", "content": "fix the bug"}]
        for _ in range(2):  # a two-turn conversation: the second prompt extends the first call
            reply = httpx.post(
                f"{proxy.url}/v1/chat/completions", headers={"Authorization": f"Bearer {token}"}, timeout=120,
                json={"model": MODEL, "messages": messages, "max_tokens": 12, "seed": 7},
            ).json()  # fmt: skip
            assert "orchard" not in reply  # the harness sees a plain OpenAI response
            direct = httpx.post(
                f"{base_url}/v1/chat/completions", timeout=120,
                json={"model": MODEL, "messages": messages, "max_tokens": 12, "seed": 7},
            ).json()  # fmt: skip
            traces.append(TokenTrace.model_validate(direct["orchard"]))
            messages = [*messages, reply["choices"][0]["message"], {"role": "user", "content": "and the tests?"}]
        closed = httpx.delete(f"{proxy.url}/admin/episodes/engine-ep", headers=headers).json()
    finally:
        proxy.stop()
    assert closed["calls_recorded"] == 2
    codec, rebuilt = Codec.default(), PromptReconstructor()
    records = [codec.decode(r.value).record for r in bus.consumer([MODEL_CALLS]).poll(max_records=10, timeout_s=1)]
    bus.close()
    for record, trace in zip(records, traces, strict=True):
        assert rebuilt.add_model_call(record).tolist() == trace.prompt_token_ids
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == trace.completion_token_ids
        assert unpack_logprobs(record["completion_logprobs"]).tolist() == pytest.approx(
            trace.completion_logprobs, abs=1e-5
        )
    assert records[1]["prompt_base_call_index"] == 0 and records[1]["prompt_prefix_length"] > 0


def test_a_messages_call_behind_the_proxy_is_rendered_by_the_chat_template_and_recorded_token_exactly(
    base_url: str, tmp_path: Path
) -> None:
    from orchard.codec import Codec
    from orchard.prefix_delta import PromptReconstructor
    from orchard.tokens import unpack_token_ids
    from orchard.topics import MODEL_CALLS, STANDARD_TOPICS
    from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    admin = "engine-proxy-admin-0123456789"
    proxy = BackgroundServer(create_proxy_app(ProxySettings(backend_base_url=f"{base_url}/v1", admin_token=admin), bus))
    proxy.start()
    headers = {"Authorization": f"Bearer {admin}"}
    try:
        opening = {"episode_id": "messages-ep", "task_id": "t", "harness": "test", "model": MODEL, "ttl_s": 600}
        key = {"x-api-key": httpx.post(f"{proxy.url}/admin/episodes", headers=headers, json=opening).json()["token"]}
        body = {"model": MODEL, "system": "You are terse.", "messages": [{"role": "user", "content": "fix the bug"}]}
        body |= {"max_tokens": 12, "temperature": 0.0}
        reply = httpx.post(f"{proxy.url}/v1/messages?beta=true", headers=key, json=body, timeout=120).json()
        counted = httpx.post(f"{proxy.url}/v1/messages/count_tokens", headers=key, json=body, timeout=120).json()
        chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "fix the bug"}]
        direct = httpx.post(
            f"{base_url}/v1/chat/completions", timeout=120,
            json={"model": MODEL, "messages": chat, "max_tokens": 12, "temperature": 0.0},
        ).json()  # fmt: skip
        closed = httpx.delete(f"{proxy.url}/admin/episodes/messages-ep", headers=headers).json()
    finally:
        proxy.stop()
    trace = TokenTrace.model_validate(direct["orchard"])
    assert closed["calls_recorded"] == 1
    [record] = [Codec.default().decode(r.value).record for r in bus.consumer([MODEL_CALLS]).poll(10, 1)]
    bus.close()
    assert PromptReconstructor().add_model_call(record).tolist() == trace.prompt_token_ids
    assert unpack_token_ids(record["completion_token_ids"]).tolist() == trace.completion_token_ids
    assert (record["api_flavour"], record["harness_api"]) == ("CHAT", "MESSAGES")
    text = direct["choices"][0]["message"]["content"] or ""
    assert reply["content"] == ([{"type": "text", "text": text}] if text else [])
    assert (reply["stop_reason"], reply["usage"]["input_tokens"], reply["usage"]["output_tokens"]) == (
        "max_tokens" if direct["choices"][0]["finish_reason"] == "length" else "end_turn",
        len(trace.prompt_token_ids),
        len(trace.completion_token_ids),
    )
    assert counted == {"input_tokens": len(trace.prompt_token_ids)}
