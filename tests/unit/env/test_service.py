"""The Env HTTP service: bearer auth, submit/list/get/cancel, event streams, Prometheus metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from orchard.env.exceptions import InvalidEpisodeError
from orchard.env.scheduler import Episode, EpisodeState, EventSink, Scheduler
from orchard.env.service import create_env_app

TOKEN = "s3cret-token"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class SleepRunner:
    """Sleeps ``options.sleep`` seconds and succeeds; knows the tasks ``t1`` and ``t2``."""

    def check(self, request: dict[str, Any]) -> None:
        if request["task_id"] not in ("t1", "t2"):
            raise InvalidEpisodeError(f"unknown task {request['task_id']!r}; known: ['t1', 't2']")
        if request["options"].get("explode"):
            raise RuntimeError("the runner's own bug")

    async def run(self, episode: Episode, emit: EventSink) -> EpisodeState:
        await asyncio.sleep(episode.request["options"].get("sleep", 0.01))
        return EpisodeState.SUCCEEDED

    async def report(self, episode: Episode, state: EpisodeState, error: str | None) -> None:
        return None


def submission(episode_id: str, sleep: float = 0.01) -> dict[str, object]:
    """A valid submission body."""
    return {
        "task_id": "t1",
        "harness": "builtin",
        "model": "tiny",
        "episode_id": episode_id,
        "options": {"sleep": sleep},
    }


@pytest.mark.asyncio
async def test_every_route_but_healthz_needs_the_token() -> None:
    app = create_env_app(Scheduler(SleepRunner()), TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://env") as client:
        assert (await client.get("/healthz")).status_code == 200
        for method, path in (("GET", "/episodes"), ("GET", "/metrics"), ("POST", "/episodes")):
            assert (await client.request(method, path)).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await client.request(method, path, headers=wrong)).status_code == 401


@pytest.mark.asyncio
async def test_submit_follow_cancel_and_metrics() -> None:
    scheduler = Scheduler(SleepRunner(), concurrency=1)
    app = create_env_app(scheduler, TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://env", headers=AUTH) as client:
        created = await client.post("/episodes", json=submission("ep-1"))
        assert created.status_code == 201 and created.json()["state"] == "QUEUED"
        assert (await client.post("/episodes", json=submission("ep-1"))).status_code == 409
        bad = await client.post("/episodes", json={"task_id": "t", "harness": "h"})
        assert bad.status_code == 422 and "model" in bad.text
        async with client.stream("GET", "/episodes/ep-1/events") as stream:
            kinds = [json.loads(line)["kind"] async for line in stream.aiter_lines() if line]
        assert kinds == ["queued", "started", "ended"]
        assert (await client.get("/episodes/ep-1")).json()["state"] == "SUCCEEDED"

        await client.post("/episodes", json=submission("ep-2", sleep=10))
        await asyncio.sleep(0.05)
        assert (await client.post("/episodes/ep-2/cancel")).status_code == 202
        await scheduler.wait("ep-2")
        assert [e["state"] for e in (await client.get("/episodes")).json()] == ["SUCCEEDED", "CANCELLED"]
        assert (await client.get("/episodes/nope")).status_code == 404

        text = (await client.get("/metrics")).text
        assert 'orchard_episodes_finished_total{status="SUCCEEDED"} 1.0' in text
        assert 'orchard_episodes_finished_total{status="CANCELLED"} 1.0' in text
        assert "orchard_episodes_running 0.0" in text
        assert "orchard_episode_launch_seconds_count 2.0" in text


@pytest.mark.asyncio
async def test_bad_submissions_are_refused_with_the_reason_before_any_episode_exists() -> None:
    scheduler = Scheduler(SleepRunner())
    app = create_env_app(scheduler, TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://env", headers=AUTH) as client:
        unknown = await client.post("/episodes", json={**submission("ep-1"), "task_id": "no-such-task"})
        assert (unknown.status_code, unknown.json()) == (
            422, {"detail": "unknown task 'no-such-task'; known: ['t1', 't2']"},
        )  # fmt: skip
        wrong_types = await client.post("/episodes", json={**submission("ep-2"), "options": [], "timeout_s": "x"})
        assert wrong_types.status_code == 422
        assert {e["loc"][-1] for e in wrong_types.json()["detail"]} == {"options", "timeout_s"}
        assert (await client.post("/episodes", json={**submission("ep-3"), "extra": 1})).status_code == 422
        not_json = await client.post("/episodes", content=b"\xff", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and "parsing the body" in not_json.json()["detail"]
        assert (await client.get("/episodes", params={"state": "BOGUS"})).status_code == 422
        assert (await client.get("/episodes")).json() == []
        assert scheduler.episodes == {} and scheduler.counts()["QUEUED"] == 0


@pytest.mark.asyncio
async def test_an_unexpected_error_is_a_500_with_a_json_body() -> None:
    app = create_env_app(Scheduler(SleepRunner()), TOKEN)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://env", headers=AUTH) as client:
        broken = await client.post("/episodes", json={**submission("ep-1"), "options": {"explode": True}})
        assert (broken.status_code, broken.json()) == (
            500, {"detail": "RuntimeError: the runner's own bug", "error": "internal"},
        )  # fmt: skip
        assert (await client.post("/episodes", json=submission("ep-1"))).status_code == 201
