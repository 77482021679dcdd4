"""The Env HTTP service: bearer auth, submit/list/get/cancel, event streams, Prometheus metrics."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from orchard.env.scheduler import Episode, EpisodeState, EventSink, Scheduler
from orchard.env.service import create_env_app

TOKEN = "s3cret-token"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class SleepRunner:
    """Sleeps ``options.sleep`` seconds and succeeds."""

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
