"""Honest call counts: every model call the recording proxy receives is in exactly one count of its episode summary
(recorded, abandoned by the harness, refused or failed by the backend, ...), and the Env's outcome carries them.

Real servers on loopback: a stub backend that refuses, fails or is slow on demand (uvicorn), the proxy on an embedded
bus, the Env's ``ProxyAdmin`` and ``LocalEpisodeRunner`` publishing the outcome; the harness's calls are made here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.token_trace import TokenTrace
from orchard.env.episode_runner import CALL_COUNTS, LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Episode, EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.sandbox import Runtime, Sandbox, SandboxSpec
from orchard.topics import OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

ADMIN = "admin-token-for-call-counts-0123"  # noqa: S105 - a test token
TRACE = TokenTrace(prompt_token_ids=[1, 2], completion_token_ids=[3], completion_logprobs=[-0.5], policy_version=4)


def stub_backend(cancelled: list[bool]) -> FastAPI:
    """A chat backend that answers by the last message: ``refuse`` a 400, ``fail`` a 500, ``slow`` the answer after
    a second (a stream: before it starts; ``cancelled`` gets whether the proxy hung up meanwhile), anything else the
    answer at once; streamed or not, with a token trace."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        said = body["messages"][-1]["content"]
        if said == "refuse":
            error = {"message": "prompt too long", "type": "invalid_request_error", "param": None, "code": "length"}
            return JSONResponse({"error": error}, 400)
        if said == "fail":
            return JSONResponse({"error": {"message": "engine died", "type": "server_error"}}, 500)
        if said == "slow":
            cancelled.append(await hung_up_within(request, 1.0))
        message = {"index": 0, "finish_reason": "stop"}
        if not body.get("stream"):
            answer = {"id": "x", "object": "chat.completion", "choices": [message | {"message": {"content": "hi"}}]}
            return JSONResponse(answer | TRACE.as_field())
        chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [message | {"delta": {"content": "hi"}}]}
        events = [f"data: {json.dumps(chunk | TRACE.as_field())}\n\n", "data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    return app


async def hung_up_within(request: Request, seconds: float) -> bool:
    """Whether the client of ``request`` disconnects within ``seconds``."""
    for _ in range(int(seconds / 0.01)):
        if await request.is_disconnected():
            return True
        await asyncio.sleep(0.01)
    return False


class NoSandboxes(Runtime):
    """The Env's runtime when the test itself is the harness: no sandbox is ever made, so none is deleted."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        raise NotImplementedError("the test makes the harness's calls itself")

    def get(self, sandbox_id: str) -> Sandbox:
        raise KeyError(sandbox_id)

    def list(self) -> list[Sandbox]:
        return []

    def delete(self, sandbox_id: str) -> None:
        return None

    def reap_expired(self) -> list[str]:
        return []


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Bus, str, list[bool]]]:
    """The bus, the URL of a proxy in front of the stub backend, and what the backend saw of slow calls."""
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    cancelled: list[bool] = []
    with BackgroundServer(stub_backend(cancelled)) as backend:
        settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-counts")
        with BackgroundServer(create_proxy_app(settings, bus)) as proxy:
            yield bus, proxy.url, cancelled
    bus.close()


CALLS = [  # what the harness says, whether it streams, and whether it waits for the answer
    ("hello", False, True),
    ("hello", True, True),
    ("refuse", False, True),
    ("refuse", True, True),
    ("fail", False, True),
    ("fail", True, True),
    ("slow", False, False),
    ("slow", True, False),
]


async def harness_calls(url: str, token: str) -> list[int | None]:
    """Make ``CALLS`` as a harness would; the status of each (None: it hung up before the answer)."""
    statuses: list[int | None] = []
    async with httpx.AsyncClient(base_url=f"{url}/v1", headers={"authorization": f"Bearer {token}"}) as client:
        for said, stream, waits in CALLS:
            body = {"model": "policy", "messages": [{"role": "user", "content": said}], "stream": stream}
            try:
                response = await client.post("/chat/completions", json=body, timeout=30 if waits else 0.2)
                statuses.append(response.status_code)
            except httpx.ReadTimeout:  # the client closes the connection
                statuses.append(None)
    return statuses


async def episode_through_the_env(url: str, bus: Bus, tasks: TaskCatalog) -> tuple[list[int | None], dict[str, Any]]:
    """Open an episode through the Env's proxy client, make the harness's calls, and let the runner close it and
    publish its outcome (``report``: what the Env does with an episode stopped before it finished)."""
    admin = ProxyAdmin(url, ADMIN)
    runner = LocalEpisodeRunner(
        runtime=NoSandboxes(), tasks=tasks, proxy=admin, proxy_url=url, producer=bus.producer(), run_id="run-counts"
    )
    try:
        token = await admin.open_episode("ep-counts", "task-1", "test", "policy", ttl_s=60)
        statuses = await harness_calls(url, token)
        episode = Episode(episode_id="ep-counts", request={"task_id": "task-1", "harness": "test", "model": "policy"})
        await runner.report(episode, EpisodeState.CANCELLED, "stopped by the test")
    finally:
        await admin.aclose()
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {ADMIN}"}) as client:
        summary = (await client.get("/admin/episodes/ep-counts")).json()  # the closed episode's
    return statuses, summary


def test_every_call_is_in_one_count_of_the_summary_and_the_outcome_carries_them(
    stack: tuple[Bus, str, list[bool]], tmp_path: Path
) -> None:
    bus, url, cancelled = stack
    (tmp_path / "tasks").mkdir()
    statuses, summary = asyncio.run(episode_through_the_env(url, bus, TaskCatalog(tmp_path / "tasks")))

    assert statuses == [200, 200, 400, 400, 502, 502, None, None]  # a refusal passes through, a failure is a 502
    deadline = time.monotonic() + 5
    while len(cancelled) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cancelled == [True, True]  # the proxy cancelled the backend requests of the calls the harness abandoned
    expected = {"received": 8, "recorded": 2, "pending": 0, "failed": 0, "dropped": 0, "abandoned": 2, "refused": 2,
                "backend_failed": 2, "in_flight": 0}  # fmt: skip
    assert {name: summary[f"calls_{name}"] for name in expected} == expected
    assert expected["received"] == sum(expected[name] for name in CALL_COUNTS)
    [outcome] = [Codec.default().decode(r.value).record for r in bus.consumer([OUTCOMES]).poll(10, 1.0)]
    assert (outcome["episode_id"], outcome["status"], outcome["num_model_calls"], outcome["policy_version"]) == (
        "ep-counts", "CANCELLED", 2, 4,
    )  # fmt: skip
    assert outcome["model_call_counts"] == expected
