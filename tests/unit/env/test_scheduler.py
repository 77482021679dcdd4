"""The episode scheduler's rules: concurrency, timeouts, retries of infrastructure failures only, cancellation,
graceful shutdown — every episode ends with exactly one outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchard.env.exceptions import InvalidEpisodeError
from orchard.env.scheduler import Episode, EpisodeState, EventSink, InfrastructureError, Scheduler
from orchard.exceptions import OrchardError


class ScriptedRunner:
    """Runs episodes by their request: ``sleep`` seconds, then ``outcome`` (a state, or an exception to raise)."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.runs: list[str] = []
        self.reports: list[tuple[str, EpisodeState]] = []
        self.failures_left: dict[str, int] = {}

    def check(self, request: dict[str, Any]) -> None:
        if request.get("task_id") == "unknown":
            raise InvalidEpisodeError("unknown task 'unknown'")

    async def run(self, episode: Episode, emit: EventSink) -> EpisodeState:
        self.runs.append(episode.episode_id)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            emit("harness-started")
            await asyncio.sleep(episode.request.get("sleep", 0.01))
            if self.failures_left.get(episode.episode_id, 0) > 0:
                self.failures_left[episode.episode_id] -= 1
                raise InfrastructureError("sandbox could not be created")
            outcome = episode.request.get("outcome", "SUCCEEDED")
            if outcome == "raise":
                raise ValueError("harness exploded")
            return EpisodeState(outcome)
        finally:
            self.active -= 1

    async def report(self, episode: Episode, state: EpisodeState, error: str | None) -> None:
        self.reports.append((episode.episode_id, state))


@pytest.mark.asyncio
async def test_concurrency_is_limited_and_every_episode_finishes() -> None:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner, concurrency=3)
    episodes = [scheduler.submit({"sleep": 0.02}, f"e{i}") for i in range(100)]
    await asyncio.gather(*(scheduler.wait(e.episode_id) for e in episodes))
    assert runner.peak == 3
    assert scheduler.counts()["SUCCEEDED"] == 100
    assert sorted(runner.runs) == sorted(f"e{i}" for i in range(100))
    assert scheduler.metrics.launched == 100


@pytest.mark.asyncio
async def test_an_episode_past_its_timeout_is_timed_out_and_reported() -> None:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner, timeout_s=0.05)
    episode = await scheduler.wait(scheduler.submit({"sleep": 5}, "slow").episode_id)
    assert episode.state == EpisodeState.TIMED_OUT
    assert runner.reports == [("slow", EpisodeState.TIMED_OUT)]
    assert "0.05s" in (episode.error or "")


@pytest.mark.asyncio
async def test_infrastructure_failures_are_retried_agent_failures_are_not() -> None:
    runner = ScriptedRunner()
    runner.failures_left = {"flaky": 2, "broken": 9}
    scheduler = Scheduler(runner, max_retries=2)
    for episode_id, request in (("flaky", {}), ("broken", {}), ("crash", {"outcome": "raise"})):
        scheduler.submit(request, episode_id)
    flaky, broken, crash = [await scheduler.wait(e) for e in ("flaky", "broken", "crash")]
    assert (flaky.state, flaky.attempts) == (EpisodeState.SUCCEEDED, 3)
    assert (broken.state, broken.attempts) == (EpisodeState.CRASHED, 3)
    assert "infrastructure failure" in (broken.error or "")
    assert (crash.state, crash.attempts, crash.error) == (EpisodeState.CRASHED, 1, "ValueError: harness exploded")
    assert sorted(runner.reports) == [("broken", EpisodeState.CRASHED), ("crash", EpisodeState.CRASHED)]


@pytest.mark.asyncio
async def test_cancelling_queued_and_running_episodes_reports_them_cancelled() -> None:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner, concurrency=1)
    scheduler.submit({"sleep": 5}, "running")
    scheduler.submit({"sleep": 5}, "queued")
    await asyncio.sleep(0.05)
    assert scheduler.cancel("queued") and scheduler.cancel("running")
    assert [(await scheduler.wait(e)).state for e in ("running", "queued")] == [EpisodeState.CANCELLED] * 2
    assert sorted(runner.reports) == [("queued", EpisodeState.CANCELLED), ("running", EpisodeState.CANCELLED)]
    assert scheduler.cancel("running") is False


@pytest.mark.asyncio
async def test_shutdown_cancels_and_reports_everything_and_refuses_new_work() -> None:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner, concurrency=2)
    for i in range(5):
        scheduler.submit({"sleep": 5}, f"e{i}")
    await asyncio.sleep(0.05)
    await scheduler.shutdown()
    assert scheduler.counts()["CANCELLED"] == 5
    assert len(runner.reports) == 5
    with pytest.raises(OrchardError, match="shutting down"):
        scheduler.submit({}, "late")


@pytest.mark.asyncio
async def test_events_replay_history_then_follow_until_the_end() -> None:
    scheduler = Scheduler(ScriptedRunner())
    episode = scheduler.submit({"sleep": 0.05}, "watched")
    kinds: list[Any] = [event["kind"] async for event in scheduler.events(episode.episode_id)]
    assert kinds == ["queued", "started", "harness-started", "ended"]
    again = [event["kind"] async for event in scheduler.events(episode.episode_id)]
    assert again == kinds


@pytest.mark.asyncio
async def test_a_request_the_runner_refuses_creates_no_episode() -> None:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner)
    with pytest.raises(InvalidEpisodeError, match="unknown task 'unknown'"):
        scheduler.submit({"task_id": "unknown"}, "e1")
    assert (scheduler.episodes, runner.runs, runner.reports, scheduler.metrics.launched) == ({}, [], [], 0)
    await scheduler.wait(scheduler.submit({}, "e1").episode_id)  # the id is still free
    assert scheduler.episodes["e1"].state == EpisodeState.SUCCEEDED
