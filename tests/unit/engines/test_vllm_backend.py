"""The vLLM shim end to end against an in-process fake of vLLM's HTTP API: mapping, errors, drain-and-swap reload.

The fake answers as vLLM does (``tests/unit/engines/vllm_fixtures.py``) and records what the shim asked:
``/v1/chat/completions`` (optionally held until the test releases it), ``/collective_rpc`` and
``/reset_prefix_cache``. Both apps run in this test's event loop through ``httpx.ASGITransport``: no sockets, no GPU.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from safetensors.numpy import save_file

from orchard.engines.exceptions import CheckpointError
from orchard.engines.token_trace import trace_of
from orchard.engines.vllm_backend import VLLMBackend, backend_error, create_vllm_app

_spec = importlib.util.spec_from_file_location("vllm_fixtures", Path(__file__).with_name("vllm_fixtures.py"))
assert _spec is not None and _spec.loader is not None
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

USER = [{"role": "user", "content": "Hello?"}]


class FakeVLLM:
    """vLLM's endpoints the shim uses, recording every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.hold: asyncio.Event | None = None
        self.rpc_status = 200
        self.app = FastAPI()
        self.app.get("/v1/models")(self.models)
        self.app.post("/v1/chat/completions")(self.chat)
        self.app.post("/collective_rpc")(self.rpc)
        self.app.post("/reset_prefix_cache")(self.reset)
        self.app.post("/tokenize")(self.tokenize)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "qwen-small", "object": "model", "max_model_len": 2048}]}

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.calls.append(("chat", body))
        if body["messages"][-1]["content"] == "too long":
            error = {"message": "This model's maximum context length is 2048 tokens. However, you requested 9000"}
            return JSONResponse({"error": error | {"type": "BadRequestError", "param": None, "code": 400}}, 400)
        if self.hold is not None:
            await self.hold.wait()
        if body["stream"]:
            frames = [f"data: {json.dumps(c)}\n\n" for c in fx.hello_stream()] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(frames), media_type="text/event-stream")
        return JSONResponse(fx.hello_response(body["n"]))

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        self.calls.append(("rpc", body))
        if self.rpc_status != 200:
            return JSONResponse({"detail": "CUDA error: out of memory"}, self.rpc_status)
        return JSONResponse({"results": [{"files": 1, "tensors": 2}]})

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        self.calls.append(("tokenize", body))
        return JSONResponse({"count": 3, "max_model_len": 2048, "tokens": [5, 6, 7]})

    async def reset(self) -> Response:
        self.calls.append(("reset", None))
        return Response(status_code=200)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


def write_checkpoint(directory: Path, shapes: dict[str, tuple[int, ...]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()}, directory / "model.safetensors"
    )
    return directory


SHAPES = {"embed.weight": (8, 4), "norm.weight": (4,)}


@pytest_asyncio.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[FakeVLLM, VLLMBackend, httpx.AsyncClient]]:
    fake = FakeVLLM()
    vllm_client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake.app), base_url="http://vllm")
    backend = VLLMBackend(
        vllm_client, served_name="policy", reference_dir=write_checkpoint(tmp_path / "base", SHAPES),
        drain_timeout_s=5, reload_timeout_s=5, default_max_tokens=64,
    )  # fmt: skip
    await backend.start()
    shim = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_vllm_app(backend)), base_url="http://shim")
    yield fake, backend, shim
    await shim.aclose()
    await vllm_client.aclose()


def sse(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.asyncio
async def test_chat_goes_to_vllm_with_token_id_fields_and_comes_back_with_the_trace(setup: Any) -> None:
    fake, backend, shim = setup
    response = await shim.post("/v1/chat/completions", json={"model": "policy", "messages": USER, "seed": 3})
    assert response.status_code == 200
    body = response.json()
    assert (body["model"], body["choices"][0]["message"]["content"]) == ("policy", "Hello there!")
    assert trace_of(body) is not None and trace_of(body).completion_token_ids == fx.HELLO_IDS  # type: ignore[union-attr]
    [(_, sent)] = fake.calls
    assert (sent["model"], sent["return_token_ids"], sent["logprobs"], sent["seed"], sent["max_completion_tokens"]) == (
        "qwen-small",
        True,
        True,
        3,
        64,
    )
    models = (await shim.get("/v1/models")).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("policy", 2048)]


@pytest.mark.asyncio
async def test_tokenize_asks_vllms_tokenize_with_the_checked_messages(setup: Any) -> None:
    fake, _, shim = setup
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    response = await shim.post("/v1/tokenize", json={"model": "policy", "messages": USER, "tools": tools})
    assert response.json() == {"count": 3, "max_model_len": 2048, "tokens": [5, 6, 7]}
    assert fake.calls == [
        ("tokenize", {"model": "qwen-small", "messages": USER, "tools": tools, "add_generation_prompt": True})
    ]
    assert (await shim.post("/v1/tokenize", json={"model": "other", "messages": USER})).status_code == 404


@pytest.mark.asyncio
async def test_streamed_chat_and_streamed_responses_carry_the_trace_at_the_end(setup: Any) -> None:
    _, _, shim = setup
    chat = await shim.post("/v1/chat/completions", json={"model": "policy", "messages": USER, "stream": True})
    chunks = sse(chat.text)
    assert chat.text.endswith("data: [DONE]\n\n")
    assert [trace_of(c) is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    response = await shim.post("/v1/responses", json={"model": "policy", "input": "Hello?", "stream": True})
    events = sse(response.text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert (events[-1]["type"], trace_of(events[-1]["response"]).policy_version) == ("response.completed", 0)  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_errors_are_openai_error_objects_with_the_local_engines_codes(setup: Any) -> None:
    _, _, shim = setup
    unknown = await shim.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER})
    too_long = await shim.post(
        "/v1/chat/completions", json={"model": "policy", "messages": [USER[0] | {"content": "too long"}]}
    )
    bad_tools = await shim.post(
        "/v1/chat/completions", json={"model": "policy", "messages": USER, "tools": [{"type": "x"}]}
    )
    assert [(r.status_code, r.json()["error"]["code"]) for r in (unknown, too_long, bad_tools)] == [
        (404, "model_not_found"),
        (400, "context_length_exceeded"),
        (400, "invalid_request"),
    ]


def test_vllm_status_codes_map_to_orchard_errors() -> None:
    assert [type(backend_error(s, {"error": {"message": "m"}})).__name__ for s in (400, 429, 500)] == [
        "InvalidRequestError",
        "EngineOverloadedError",
        "VLLMProtocolError",
    ]


@pytest.mark.asyncio
async def test_swap_loads_through_collective_rpc_resets_the_prefix_cache_and_bumps_the_version(
    setup: Any, tmp_path: Path
) -> None:
    fake, backend, shim = setup
    directory = write_checkpoint(tmp_path / "v1", SHAPES)
    await backend.swap(directory, 1)
    assert fake.calls == [
        ("rpc", {"method": "orchard_load_weights", "args": [str(directory.resolve())], "timeout": 5}),
        ("reset", None),
    ]
    body = (await shim.post("/v1/chat/completions", json={"model": "policy", "messages": USER})).json()
    assert (trace_of(body).policy_version, (await shim.get("/healthz")).json()["policy_version"]) == (1, 1)  # type: ignore[union-attr]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda d: write_checkpoint(d, {"embed.weight": (9, 4), "norm.weight": (4,)}), "other shapes"),
        (lambda d: write_checkpoint(d, {"embed.weight": (8, 4)}), "miss"),
        (lambda d: (write_checkpoint(d, SHAPES) / "model.safetensors").write_bytes(b"\x10\x00"), "too short"),
        (lambda d: d.mkdir(), "no \\*.safetensors"),
    ],
)
async def test_a_corrupt_or_incompatible_version_is_refused_before_vllm_is_touched(
    setup: Any, tmp_path: Path, damage: Any, says: str
) -> None:
    fake, backend, _ = setup
    directory = tmp_path / "bad"
    damage(directory)
    with pytest.raises(CheckpointError, match=says):
        await backend.swap(directory, 1)
    assert (fake.calls, backend.policy_version, backend.broken) == ([], 0, None)


@pytest.mark.asyncio
async def test_a_load_that_fails_inside_vllm_makes_the_engine_unavailable_until_a_version_loads(
    setup: Any, tmp_path: Path
) -> None:
    fake, backend, shim = setup
    fake.rpc_status = 500
    with pytest.raises(CheckpointError, match="HTTP 500"):
        await backend.swap(write_checkpoint(tmp_path / "v1", SHAPES), 1)
    refused = await shim.post("/v1/chat/completions", json={"model": "policy", "messages": USER})
    assert (refused.status_code, refused.json()["error"]["code"], (await shim.get("/healthz")).status_code) == (
        503,
        "engine_unavailable",
        503,
    )
    fake.rpc_status = 200
    await backend.swap(write_checkpoint(tmp_path / "v2", SHAPES), 2)
    assert (await shim.post("/v1/chat/completions", json={"model": "policy", "messages": USER})).status_code == 200


@pytest.mark.asyncio
async def test_requests_in_flight_finish_on_their_version_while_the_swap_waits_and_later_ones_get_the_new_one(
    setup: Any, tmp_path: Path
) -> None:
    fake, backend, shim = setup
    fake.hold = asyncio.Event()
    payload = {"model": "policy", "messages": USER}
    first = asyncio.create_task(shim.post("/v1/chat/completions", json=payload))
    while backend.gate.in_flight == 0:
        await asyncio.sleep(0.001)
    swap = asyncio.create_task(backend.swap(write_checkpoint(tmp_path / "v1", SHAPES), 1))
    while not backend.gate.swapping:
        await asyncio.sleep(0.001)
    second = asyncio.create_task(shim.post("/v1/chat/completions", json=payload))
    while backend.gate.waiting == 0:
        await asyncio.sleep(0.001)
    assert fake.kinds() == ["chat"]  # the load waits for the first request
    fake.hold.set()
    versions = [trace_of((await task).json()).policy_version for task in (first, second)]  # type: ignore[union-attr]
    await swap
    assert (versions, fake.kinds()) == ([0, 1], ["chat", "rpc", "reset", "chat"])


@pytest.mark.asyncio
async def test_the_reloaders_thread_swaps_through_load_version(setup: Any, tmp_path: Path) -> None:
    fake, backend, _ = setup
    await asyncio.to_thread(backend.load_version, write_checkpoint(tmp_path / "v3", SHAPES), 3)
    assert (backend.policy_version, fake.kinds()) == (3, ["rpc", "reset"])
    with pytest.raises(CheckpointError, match="not newer"):
        await asyncio.to_thread(backend.load_version, write_checkpoint(tmp_path / "v2", SHAPES), 2)
