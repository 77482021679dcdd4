"""The Orchard Env HTTP service (``orchard env serve``): submit, list, inspect, cancel and follow episodes.

Every route but ``/healthz`` needs ``Authorization: Bearer <token>``. ``/metrics`` is Prometheus text:
episodes running and queued, finished by status, and launch latency (submit to start).

Errors are JSON ``{"detail": text}``: 401 without the token, 404 for an unknown episode, 409 for an episode id
already used, 422 for a malformed body or one naming a task, harness or harness options the Env does not have
(refused before any episode is created), 503 while shutting down. An error no route anticipated is answered 400 when
the request caused it, else 500 with the traceback logged; the connection stays open either way.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field

from orchard.env.exceptions import InvalidEpisodeError
from orchard.env.scheduler import EpisodeState, Scheduler
from orchard.exceptions import OrchardError
from orchard.sandbox.api import LastLineOfDefence


class EpisodeSubmission(BaseModel):
    """What a client submits: the task, the harness, the model endpoint, limits."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1)
    harness: str = Field(min_length=1)
    model: str = Field(min_length=1, description="Model name the harness asks the proxy for.")
    episode_id: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    group_id: str | None = None
    timeout_s: float | None = Field(None, gt=0, description="Override of the service's wall-clock timeout.")
    options: dict[str, Any] = Field(default_factory=dict, description="Harness- or task-specific settings.")


class EnvMetrics:
    """Prometheus metrics of one service instance (own registry, so several apps can live in one process)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.registry = CollectorRegistry()
        self.scheduler = scheduler
        self.running = Gauge("orchard_episodes_running", "Episodes running now", registry=self.registry)
        self.queued = Gauge("orchard_episodes_queued", "Episodes waiting for a slot", registry=self.registry)
        self.finished = Counter(
            "orchard_episodes_finished", "Episodes finished, by status", ["status"], registry=self.registry
        )
        self.launch = Histogram(
            "orchard_episode_launch_seconds", "Submit-to-start latency", registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )  # fmt: skip
        self._seen_finished: dict[str, int] = {}
        self._seen_launches = 0

    def render(self) -> bytes:
        """Bring the metrics up to date with the scheduler and render them."""
        counts = self.scheduler.counts()
        self.running.set(counts["RUNNING"])
        self.queued.set(counts["QUEUED"])
        for status, total in self.scheduler.metrics.finished.items():
            self.finished.labels(status=status).inc(total - self._seen_finished.get(status, 0))
            self._seen_finished[status] = total
        latencies = self.scheduler.metrics.launch_latencies_s
        for value in latencies[self._seen_launches :]:
            self.launch.observe(value)
        self._seen_launches = len(latencies)
        return generate_latest(self.registry)


def create_env_app(scheduler: Scheduler, token: str) -> FastAPI:
    """The service around ``scheduler``; shutting the app down shuts the scheduler down (reporting outcomes)."""
    if not token:
        raise OrchardError("the Env service needs a non-empty bearer token")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await scheduler.shutdown()

    app = FastAPI(title="Orchard Env", lifespan=lifespan)
    app.add_middleware(LastLineOfDefence, render=_detail)
    metrics = EnvMetrics(scheduler)

    def authorized(request: Request) -> None:
        supplied = request.headers.get("authorization", "")
        if not hmac.compare_digest(supplied.encode(), f"Bearer {token}".encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token")

    guarded = [Depends(authorized)]

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", dependencies=guarded)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/episodes", status_code=201, dependencies=guarded)
    async def submit(body: EpisodeSubmission) -> dict[str, Any]:
        try:
            episode = scheduler.submit(body.model_dump(), body.episode_id)
        except InvalidEpisodeError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        except OrchardError as exc:
            raise HTTPException(status_code=503 if scheduler.closing else 409, detail=str(exc)) from exc
        return episode.summary()

    @app.get("/episodes", dependencies=guarded)
    async def list_episodes(state: EpisodeState | None = None) -> list[dict[str, Any]]:
        return [e.summary() for e in scheduler.episodes.values() if state is None or e.state == state]

    def known(episode_id: str) -> None:
        if episode_id not in scheduler.episodes:
            raise HTTPException(status_code=404, detail=f"no episode {episode_id!r}")

    @app.get("/episodes/{episode_id}", dependencies=guarded)
    async def get_episode(episode_id: str) -> dict[str, Any]:
        known(episode_id)
        return scheduler.episodes[episode_id].summary()

    @app.post("/episodes/{episode_id}/cancel", dependencies=guarded)
    async def cancel(episode_id: str) -> JSONResponse:
        known(episode_id)
        cancelled = scheduler.cancel(episode_id)
        return JSONResponse({"episode_id": episode_id, "cancelled": cancelled}, status_code=202 if cancelled else 409)

    @app.get("/episodes/{episode_id}/events", dependencies=guarded)
    async def events(episode_id: str) -> StreamingResponse:
        known(episode_id)

        async def lines() -> AsyncIterator[bytes]:
            async for event in scheduler.events(episode_id):
                yield (json.dumps(event) + "\n").encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app


def _detail(status: int, code: str, message: str) -> Response:
    """The service's error body for an error no route anticipated."""
    return JSONResponse({"detail": message, "error": code}, status_code=status)
