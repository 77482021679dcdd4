"""The episode scheduler: a concurrency limit, a wall-clock timeout per episode, retries of infrastructure
failures (never of agent failures), cancellation, and a graceful shutdown that reports what it stops.

The scheduler knows nothing about sandboxes or harnesses: it drives an ``EpisodeRunner``. A runner's ``check``
refuses a request that could never run (``InvalidEpisodeError``: an unknown task or harness) before the episode is
created, so such a request gets an error instead of an episode that later ends ``CRASHED``. A runner's ``run``
raises ``InfrastructureError`` for failures of the platform (a sandbox that could not be created, a proxy that
did not answer), which are retried; any other exception is the episode's own failure and is reported as
``CRASHED``. Every episode ends with exactly one ``report`` or a successful ``run`` (which publishes its own
outcome), so no episode is ever left without an outcome.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from orchard.exceptions import OrchardError
from orchard.logging import get_logger

log = get_logger("env.scheduler")
EVENT_HISTORY = 1000


class InfrastructureError(OrchardError):
    """A failure of the platform rather than of the agent: the episode is retried."""


class EpisodeState(StrEnum):
    """Where an episode is; the last five are final and match ``EpisodeOutcome.status``."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    CRASHED = "CRASHED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        """Whether the episode has ended."""
        return self not in (EpisodeState.QUEUED, EpisodeState.RUNNING)


@dataclass
class Episode:
    """One submitted episode and what happened to it."""

    episode_id: str
    request: dict[str, Any]
    state: EpisodeState = EpisodeState.QUEUED
    attempts: int = 0
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    listeners: list[asyncio.Queue[dict[str, Any] | None]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "episode_id": self.episode_id,
            "state": self.state.value,
            "attempts": self.attempts,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "result": self.result,
            "error": self.error,
            "request": self.request,
        }


class EpisodeRunner(Protocol):
    """What actually runs an episode (sandbox, proxy, harness, grader) and publishes its outcome."""

    def check(self, request: dict[str, Any]) -> None:
        """Raise ``InvalidEpisodeError`` if the request could never run (unknown task or harness, bad options)."""

    async def run(self, episode: Episode, emit: EventSink) -> EpisodeState:
        """Run the episode to its end, publish its outcome, return SUCCEEDED or FAILED."""

    async def report(self, episode: Episode, state: EpisodeState, error: str | None) -> None:
        """Clean up after an episode that did not finish (timed out, cancelled, crashed) and publish its outcome."""


class EventSink(Protocol):
    """Where a runner sends progress events of an episode."""

    def __call__(self, kind: str, **data: Any) -> None:
        """Record one event."""


@dataclass
class SchedulerMetrics:
    """Counters the service exports; a plain object so the scheduler needs no metrics library."""

    launched: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    launch_latencies_s: list[float] = field(default_factory=list)


class Scheduler:
    """Runs submitted episodes with at most ``concurrency`` at a time."""

    def __init__(
        self, runner: EpisodeRunner, *, concurrency: int = 8, timeout_s: float = 1800.0, max_retries: int = 2
    ) -> None:
        self.runner = runner
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.episodes: dict[str, Episode] = {}
        self.metrics = SchedulerMetrics()
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    # ---------------------------------------------------------------- public
    @property
    def closing(self) -> bool:
        """Whether ``shutdown`` was called (no new episodes are taken)."""
        return self._closing

    def submit(self, request: dict[str, Any], episode_id: str | None = None) -> Episode:
        """Queue an episode; it starts when a slot is free. ``InvalidEpisodeError`` (nothing is created) if the runner
        says the request could never run; ``OrchardError`` for a duplicate id or a scheduler shutting down."""
        if self._closing:
            raise OrchardError("the scheduler is shutting down; no new episodes")
        episode_id = episode_id or f"ep-{uuid.uuid4().hex[:12]}"
        if episode_id in self.episodes:
            raise OrchardError(f"episode {episode_id!r} was already submitted")
        self.runner.check(request)
        episode = Episode(episode_id, request)
        self.episodes[episode_id] = episode
        self._emit(episode, "queued")
        self._tasks[episode_id] = asyncio.get_running_loop().create_task(self._drive(episode))
        return episode

    def cancel(self, episode_id: str) -> bool:
        """Cancel a queued or running episode; False if it had already ended."""
        episode = self.episodes[episode_id]
        task = self._tasks.get(episode_id)
        if episode.state.final or task is None:
            return False
        task.cancel()
        return True

    def counts(self) -> dict[str, int]:
        """Episodes per state."""
        out: dict[str, int] = {state.value: 0 for state in EpisodeState}
        for episode in self.episodes.values():
            out[episode.state.value] += 1
        return out

    async def events(self, episode_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every event of an episode so far, then new ones as they come, until it ends."""
        episode = self.episodes[episode_id]
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        history = list(episode.events)
        if not episode.state.final:
            episode.listeners.append(queue)
        for event in history:
            yield event
        if episode.state.final:
            return
        try:
            while (event := await queue.get()) is not None:
                yield event
        finally:
            if queue in episode.listeners:
                episode.listeners.remove(queue)

    async def wait(self, episode_id: str) -> Episode:
        """Wait until an episode has ended."""
        task = self._tasks.get(episode_id)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        return self.episodes[episode_id]

    async def shutdown(self) -> None:
        """Stop taking episodes, cancel those queued or running, and wait until each reported its outcome."""
        self._closing = True
        running = [task for task in self._tasks.values() if not task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        log.info("scheduler stopped", cancelled=len(running))

    # ---------------------------------------------------------------- driving
    async def _drive(self, episode: Episode) -> None:
        try:
            async with self._slots:
                await self._attempts(episode)
        except asyncio.CancelledError:
            await self._finish(episode, EpisodeState.CANCELLED, "cancelled")

    async def _attempts(self, episode: Episode) -> None:
        while True:
            episode.attempts += 1
            self._start(episode)
            try:
                state = await asyncio.wait_for(self.runner.run(episode, self._sink(episode)), self.timeout_s)
            except TimeoutError:
                await self._finish(episode, EpisodeState.TIMED_OUT, f"wall-clock timeout of {self.timeout_s:g}s")
                return
            except InfrastructureError as exc:
                if episode.attempts <= self.max_retries:
                    self._emit(episode, "retry", attempt=episode.attempts, error=str(exc))
                    log.warning("infrastructure failure, retrying", episode=episode.episode_id, error=str(exc))
                    continue
                await self._finish(episode, EpisodeState.CRASHED, f"infrastructure failure: {exc}")
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an agent-side failure ends the episode as crashed
                await self._finish(episode, EpisodeState.CRASHED, f"{type(exc).__name__}: {exc}")
                return
            self._end(episode, state, None)
            return

    def _start(self, episode: Episode) -> None:
        episode.state = EpisodeState.RUNNING
        if episode.started_at is None:
            episode.started_at = time.time()
            self.metrics.launched += 1
            self.metrics.launch_latencies_s.append(episode.started_at - episode.submitted_at)
        self._emit(episode, "started", attempt=episode.attempts)

    async def _finish(self, episode: Episode, state: EpisodeState, error: str) -> None:
        """End an episode that did not run to completion: the runner cleans up and publishes its outcome."""
        try:
            await asyncio.shield(self.runner.report(episode, state, error))
        except Exception as exc:  # noqa: BLE001 - the state is final regardless; say the report failed
            error = f"{error}; reporting the outcome failed: {exc}"
            log.error("outcome report failed", episode=episode.episode_id, error=str(exc))
        self._end(episode, state, error)

    def _end(self, episode: Episode, state: EpisodeState, error: str | None) -> None:
        episode.state, episode.error, episode.ended_at = state, error, time.time()
        self.metrics.finished[state.value] = self.metrics.finished.get(state.value, 0) + 1
        self._emit(episode, "ended", state=state.value, error=error)
        for queue in episode.listeners:
            queue.put_nowait(None)
        episode.listeners.clear()

    def _sink(self, episode: Episode) -> EventSink:
        def emit(kind: str, **data: Any) -> None:
            self._emit(episode, kind, **data)

        return emit

    def _emit(self, episode: Episode, kind: str, **data: Any) -> None:
        event = {"episode_id": episode.episode_id, "kind": kind, "time": time.time(), **data}
        episode.events.append(event)
        del episode.events[:-EVENT_HISTORY]
        for queue in episode.listeners:
            queue.put_nowait(event)
