"""The rollout scheduler's logic with an injected submit function (no Env, no bus)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from orchard.codec import Codec
from orchard.episode_requests import EpisodeRequest
from producers.rollout.balanced import BalancedRolloutConfig
from producers.rollout.exceptions import SubmissionError
from producers.rollout.scheduler import (
    EnvSubmitter,
    RolloutScheduler,
    RolloutSchedulerConfig,
    episode_id_for,
    group_id_for,
)

ENV_EPISODE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")  # orchard.env.service.EpisodeSubmission.episode_id


def config(**settings: object) -> RolloutSchedulerConfig:
    base: dict[str, object] = {
        "run_id": "run-1",
        "tasks": ["django__django-11099", "Task/With Odd Chars"],
        "harness": "builtin",
        "model": "policy",
        "rollout": BalancedRolloutConfig(budget=8, min_rollouts=2, max_rollouts=6),
    }
    return RolloutSchedulerConfig(**(base | settings))  # type: ignore[arg-type]


def outcome(request: EpisodeRequest, success: bool, run_id: str = "run-1") -> dict[str, object]:
    return {
        "run_id": run_id,
        "episode_id": request.episode_id,
        "task_id": request.task_id,
        "group_id": request.group_id,
        "status": "SUCCEEDED" if success else "FAILED",
        "success": success,
    }


def test_a_round_submits_one_group_per_task_with_env_valid_unique_episode_ids() -> None:
    submitted: list[EpisodeRequest] = []
    scheduler = RolloutScheduler(config(), submitted.append)

    requests = scheduler.submit_round()

    assert submitted == requests
    assert len(requests) == 8
    assert {r.group_id for r in requests} == {"r000000-django__django-11099", "r000000-Task/With Odd Chars"}
    assert len({r.episode_id for r in requests}) == 8
    assert all(ENV_EPISODE_ID.match(r.episode_id) for r in requests)
    assert requests[0].submission() == {
        "task_id": requests[0].task_id,
        "harness": "builtin",
        "model": "policy",
        "episode_id": requests[0].episode_id,
        "group_id": requests[0].group_id,
        "timeout_s": None,
        "options": {},
    }
    assert scheduler.outstanding == {r.episode_id for r in requests}


def test_a_round_is_done_when_every_episode_has_an_outcome_and_other_runs_are_ignored() -> None:
    submitted: list[EpisodeRequest] = []
    scheduler = RolloutScheduler(config(), submitted.append)
    requests = scheduler.submit_round()

    assert scheduler.observe(outcome(requests[0], True, run_id="another-run")) is False
    for request in requests[:-1]:
        scheduler.observe(outcome(request, True))
    assert not scheduler.round_done
    scheduler.observe(outcome(requests[-1], False))

    assert scheduler.round_done
    assert scheduler.observed == 8


def test_the_next_round_moves_rollouts_to_the_task_with_mixed_outcomes() -> None:
    submitted: list[EpisodeRequest] = []
    scheduler = RolloutScheduler(config(), submitted.append)
    for _ in range(4):
        for index, request in enumerate(scheduler.submit_round()):
            mixed = request.task_id == "django__django-11099"
            scheduler.observe(outcome(request, success=mixed and index % 2 == 0))

    sizes: dict[str, int] = {}
    for request in scheduler.plan_round():
        sizes[request.task_id] = sizes.get(request.task_id, 0) + 1

    assert sizes == {"django__django-11099": 6, "Task/With Odd Chars": 2}


def test_replayed_outcomes_continue_the_round_numbering_after_a_restart() -> None:
    scheduler = RolloutScheduler(config(), lambda request: None)
    replayed = EpisodeRequest("t", group_id_for(41, "t"), episode_id_for("run-1", group_id_for(41, "t"), 0), "h", "m")

    scheduler.observe(outcome(replayed, True))

    assert scheduler.round == 42
    assert scheduler.plan_round()[0].group_id.startswith("r000042-")


def test_episode_ids_are_deterministic_per_run_group_and_index() -> None:
    assert episode_id_for("r", "g", 0) == episode_id_for("r", "g", 0)
    assert len({episode_id_for("r", "g", 0), episode_id_for("r", "g", 1), episode_id_for("r2", "g", 0)}) == 3


def test_env_submitter_posts_episodes_and_treats_a_known_episode_as_done() -> None:
    bodies: list[dict[str, object]] = []

    def env(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path, request.headers["authorization"]) == ("POST", "/episodes", "Bearer k")
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response({"e1": 201, "e2": 409}.get(str(body["episode_id"]), 503), json={"detail": "busy"})

    submitter = EnvSubmitter("http://env", "k", transport=httpx.MockTransport(env))
    submitter(EpisodeRequest("t", "g", "e1", "h", "m"))
    submitter(EpisodeRequest("t", "g", "e2", "h", "m"))
    with pytest.raises(SubmissionError, match="Orchard Env answered 503 to episode e3"):
        submitter(EpisodeRequest("t", "g", "e3", "h", "m"))
    submitter.close()

    assert [(b["episode_id"], b["group_id"], b["task_id"]) for b in bodies] == [
        ("e1", "g", "t"),
        ("e2", "g", "t"),
        ("e3", "g", "t"),
    ]


def test_the_scheduler_ends_and_says_so_when_every_task_has_reached_max_task_outcomes(tmp_path: Path) -> None:
    from orchard.bus import open_bus
    from orchard.config import EmbeddedBusConfig
    from producers.rollout.scheduler import run_rollout_scheduler

    submitted: list[EpisodeRequest] = []
    settings = config(rounds=5, rollout=BalancedRolloutConfig(budget=2, min_rollouts=2, max_rollouts=2,
                                                              max_task_outcomes=2), round_timeout_s=5.0)  # fmt: skip
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        codec = Codec.default()
        with bus.producer() as producer:

            def submit(request: EpisodeRequest) -> None:  # Env answers at once: every episode succeeds
                submitted.append(request)
                record = {**outcome(request, True), "reward": 1.0, "num_model_calls": 1, "started_at": 1, "ended_at": 1}
                producer.send(settings.topic, codec.encode("EpisodeOutcome", record), key=request.episode_id.encode())
                producer.flush()

            scheduler = run_rollout_scheduler(bus, settings, submit, codec=codec)

    assert len(submitted) == 4 and {request.task_id for request in submitted} == set(settings.tasks)
    assert (scheduler.rounds_submitted, scheduler.out_of_tasks) == (2, True)  # not 5 rounds, 3 of them empty
