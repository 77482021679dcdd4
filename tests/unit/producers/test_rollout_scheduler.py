"""The rollout scheduler's logic with an injected submit function (no Env, no bus)."""

from __future__ import annotations

import json
import re
import threading
import time
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


def test_a_round_awaits_a_policy_version_newer_than_the_one_the_last_round_started_with() -> None:
    scheduler = RolloutScheduler(config(new_policy_wait_s=5.0), [].append)
    assert scheduler.observe_policy_version({"run_id": "run-1", "version": 2}) is True
    assert not scheduler.awaits_new_policy  # the first round never waits

    scheduler.submit_round()

    assert scheduler.awaits_new_policy
    assert scheduler.observe_policy_version({"run_id": "another-run", "version": 9}) is False
    scheduler.observe_policy_version({"run_id": "run-1", "version": 2})  # the same version again
    assert scheduler.awaits_new_policy
    scheduler.observe_policy_version({"run_id": "run-1", "version": 3})
    assert not scheduler.awaits_new_policy


def test_without_new_policy_wait_rounds_never_wait() -> None:
    scheduler = RolloutScheduler(config(), [].append)
    scheduler.submit_round()
    assert not scheduler.awaits_new_policy


def _run_with_versions(
    tmp_path: Path, settings: RolloutSchedulerConfig, publish_after_round: bool
) -> tuple[list[str], RolloutScheduler]:
    """Run the scheduler on an embedded bus whose Env answers at once; optionally a trainer publishes a version after
    each round's outcomes. Returns the order of events ("round N", "version V") and the scheduler."""
    from orchard.bus import open_bus
    from orchard.config import EmbeddedBusConfig
    from producers.rollout.scheduler import run_rollout_scheduler

    events: list[str] = []
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        codec = Codec.default()
        bus.create_topic(settings.versions_topic, exist_ok=True)
        with bus.producer() as producer:
            seen_groups: set[str] = set()

            def publish_version(version: int) -> None:
                record = {"run_id": "run-1", "model": "policy", "version": version, "uri": "file:///w", "sha256": "0",
                          "trainer_step": version, "metrics": {}, "created_at": 0}  # fmt: skip
                producer.send(settings.versions_topic, codec.encode("PolicyVersion", record), key=b"policy")
                producer.flush()
                events.append(f"version {version}")

            publish_version(1)

            def submit(request: EpisodeRequest) -> None:
                if request.group_id not in seen_groups:
                    seen_groups.add(request.group_id)
                    events.append(f"group {request.group_id}")
                record = {**outcome(request, True), "reward": 1.0, "num_model_calls": 1, "started_at": 1, "ended_at": 1}
                producer.send(settings.topic, codec.encode("EpisodeOutcome", record), key=request.episode_id.encode())
                producer.flush()

            def submit_and_train(request: EpisodeRequest) -> None:
                submit(request)
                # the "trainer" publishes one version per round, after the round's last episode
                if publish_after_round and request.episode_id.endswith(f"-{settings.rollout.budget - 1}"):
                    threading.Timer(0.3, publish_version, args=(len(seen_groups) + 1,)).start()

            scheduler = run_rollout_scheduler(bus, settings, submit_and_train if publish_after_round else submit,
                                              codec=codec)  # fmt: skip
    return events, scheduler


def test_with_new_policy_wait_each_round_starts_only_after_the_trainer_published_a_newer_version(
    tmp_path: Path,
) -> None:
    settings = config(rounds=3, tasks=["t"], new_policy_wait_s=30.0,
                      rollout=BalancedRolloutConfig(budget=2, min_rollouts=2, max_rollouts=2))  # fmt: skip

    events, scheduler = _run_with_versions(tmp_path, settings, publish_after_round=True)

    assert events == ["version 1", "group r000000-t", "version 2", "group r000001-t", "version 3", "group r000002-t"]
    assert scheduler.rounds_without_new_policy == 0


def test_a_round_goes_ahead_after_new_policy_wait_when_no_version_comes_and_is_counted(tmp_path: Path) -> None:
    settings = config(rounds=3, tasks=["t"], new_policy_wait_s=0.5,
                      rollout=BalancedRolloutConfig(budget=2, min_rollouts=2, max_rollouts=2))  # fmt: skip
    started = time.monotonic()

    events, scheduler = _run_with_versions(tmp_path, settings, publish_after_round=False)

    assert events == ["version 1", "group r000000-t", "group r000001-t", "group r000002-t"]
    assert scheduler.rounds_without_new_policy == 2
    assert time.monotonic() - started >= 1.0  # two waits of 0.5 s


# ---------------------------------------------------------------------------------------------------- seeds, lockstep
def test_a_seeded_rollout_gives_each_episode_its_own_seed_and_the_same_one_again_in_a_rerun() -> None:
    from orchard.episode_requests import episode_seed

    settings = config(seed=7, options={"harness": {"temperature": 1.0}, "other": 1})
    first = RolloutScheduler(settings, [].append).submit_round()
    again = RolloutScheduler(settings, [].append).submit_round()
    reseeded = RolloutScheduler(config(seed=8), [].append).submit_round()

    seeds = [request.options["harness"]["seed"] for request in first]
    assert seeds == [request.options["harness"]["seed"] for request in again]
    assert len(set(seeds)) == len(first) == 8 and all(0 <= seed < 2**63 for seed in seeds)
    assert seeds[0] == episode_seed(7, first[0].episode_id)
    assert not set(seeds) & {request.options["harness"]["seed"] for request in reseeded}
    assert first[0].options["harness"]["temperature"] == 1.0 and first[0].options["other"] == 1
    assert "harness" not in RolloutScheduler(config(), [].append).submit_round()[0].options  # unseeded: untouched


def _lockstep_run(
    tmp_path: Path, settings: RolloutSchedulerConfig, *, caught_up: list[bool], train: bool = True
) -> tuple[list[str], RolloutScheduler]:
    """A lockstep scheduler on an embedded bus; Env answers at once; a trainer thread publishes a version for each
    announced round. ``caught_up[0]`` is what the pipeline hook answers. Returns the order of events."""
    from orchard.bus import open_bus
    from orchard.config import EmbeddedBusConfig
    from producers.rollout.scheduler import LockstepHooks, run_rollout_scheduler

    events: list[str] = []
    lock = threading.Lock()
    codec = Codec.default()
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic(settings.rounds_topic, partitions=1, exist_ok=True)
        stop = threading.Event()

        def trainer() -> None:  # publishes version r + 1 for announced round r
            with bus.consumer([settings.rounds_topic], group=None, start="earliest") as rounds, bus.producer() as out:
                while not stop.is_set():
                    for record in rounds.poll(timeout_s=0.1):
                        announced = codec.decode(record.value).record
                        if not announced["complete"]:
                            with lock:
                                events.append(f"planned {announced['round']}")
                            continue
                        with lock:
                            events.append(f"announced {announced['round']} ({announced['episodes']} episodes)")
                        trained = {"rollout_round": float(announced["round"])}
                        version = {"run_id": "run-1", "model": "policy", "version": announced["round"] + 1,
                                   "uri": "file:///w", "sha256": "0", "trainer_step": 1, "metrics": trained,
                                   "created_at": 0}  # fmt: skip
                        out.send(settings.versions_topic, codec.encode("PolicyVersion", version), key=b"policy")
                        with lock:
                            events.append(f"version {announced['round'] + 1}")

        with bus.producer() as producer:

            def submit(request: EpisodeRequest) -> None:
                with lock:
                    if f"submit {request.group_id[:7]}" not in events:
                        events.append(f"submit {request.group_id[:7]}")
                record = {**outcome(request, True), "reward": 1.0, "num_model_calls": 1, "started_at": 1, "ended_at": 1}
                producer.send(settings.topic, codec.encode("EpisodeOutcome", record), key=request.episode_id.encode())

            served: list[int] = []
            hooks = LockstepHooks(pipeline_caught_up=lambda: caught_up[0],
                                  engine_serves=lambda v: served.append(v) is None)  # fmt: skip
            thread = threading.Thread(target=trainer, daemon=True)
            if train:
                thread.start()
            try:
                scheduler = run_rollout_scheduler(bus, settings, submit, codec=codec, hooks=hooks)
            finally:
                stop.set()
                if train:
                    thread.join(timeout=10)
    events.append(f"served {sorted(set(served))}")
    return events, scheduler


def test_a_lockstep_round_starts_only_after_the_version_trained_on_the_round_before_and_the_last_one_is_awaited(
    tmp_path: Path,
) -> None:
    settings = config(rounds=3, lockstep=True, round_timeout_s=20.0)
    events, scheduler = _lockstep_run(tmp_path, settings, caught_up=[True])

    planned = [event for event in events if event.startswith("planned")]
    assert planned == ["planned 0", "planned 1", "planned 2"]
    assert [event for event in events if not event.startswith("planned")] == [
        "submit r000000", "announced 0 (8 episodes)", "version 1",
        "submit r000001", "announced 1 (8 episodes)", "version 2",
        "submit r000002", "announced 2 (8 episodes)", "version 3",
        "served [1, 2, 3]",
    ]  # fmt: skip
    assert scheduler.trained_round == 2 and scheduler.announced == {0, 1, 2}


def test_a_lockstep_round_is_announced_only_once_the_pipeline_has_caught_up(tmp_path: Path) -> None:
    from producers.rollout.scheduler import LockstepTimeout

    settings = config(rounds=2, lockstep=True, round_timeout_s=1.0)
    with pytest.raises(LockstepTimeout, match="the pipeline to make round 0's samples"):
        _lockstep_run(tmp_path, settings, caught_up=[False])


def test_a_lockstep_rollout_without_a_trainer_fails_after_the_round_timeout_instead_of_going_ahead(
    tmp_path: Path,
) -> None:
    from producers.rollout.scheduler import LockstepTimeout

    settings = config(rounds=2, lockstep=True, round_timeout_s=1.0)
    with pytest.raises(LockstepTimeout, match="a policy version trained on round 0"):
        _lockstep_run(tmp_path, settings, caught_up=[True], train=False)


def _finished_outcome(request: EpisodeRequest) -> dict[str, object]:
    return {**outcome(request, True), "reward": 1.0, "num_model_calls": 1, "started_at": 1, "ended_at": 1}


@pytest.mark.parametrize("planned", [True, False])
def test_a_restarted_lockstep_scheduler_finishes_a_round_it_had_started_but_not_announced(
    tmp_path: Path, planned: bool
) -> None:
    """The scheduler died in round 0 with 5 of its 8 outcomes in. With its plan on the bus the restart waits for the
    other 3 (here they come 1 s later), then announces it; without one (a scheduler from before plans), it
    announces what came. Then it goes on with round 1."""
    from orchard.bus import open_bus
    from orchard.config import EmbeddedBusConfig

    settings = config(rounds=1, lockstep=True, round_timeout_s=20.0)
    codec = Codec.default()
    requests = RolloutScheduler(settings, [].append).submit_round()
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, bus.producer() as producer:
        bus.create_topic(settings.topic, exist_ok=True)
        bus.create_topic(settings.rounds_topic, partitions=1, exist_ok=True)
        if planned:
            plan = {"run_id": "run-1", "round": 0, "episodes": 8, "group_ids": sorted({r.group_id for r in requests}),
                    "policy_version": None, "complete": False, "created_at": 0}  # fmt: skip
            producer.send(settings.rounds_topic, codec.encode("RolloutRound", plan), key=b"run-1")
        for request in requests[:5]:
            producer.send(settings.topic, codec.encode("EpisodeOutcome", _finished_outcome(request)), key=b"e")

    straggled: list[int] = []

    def stragglers() -> None:
        time.sleep(1.0)
        with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, bus.producer() as producer:
            for request in requests[5:]:
                producer.send(settings.topic, codec.encode("EpisodeOutcome", _finished_outcome(request)), key=b"e")
        straggled.append(int(time.time() * 1000))

    late = threading.Thread(target=stragglers, daemon=True)
    late.start()
    events, scheduler = _lockstep_run(tmp_path, settings, caught_up=[True])
    late.join()

    announced = [event for event in events if event.startswith("announced")]
    assert announced == (["announced 0 (8 episodes)", "announced 1 (8 episodes)"] if planned
                         else ["announced 0 (0 episodes)", "announced 1 (8 episodes)"])  # fmt: skip
    assert scheduler.announced == {0, 1} and scheduler.trained_round == 1
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        with bus.consumer([settings.rounds_topic], group=None, start="earliest") as reader:
            records = [codec.decode(r.value).record for r in reader.poll(max_records=50, timeout_s=1.0)]
    [first] = [r for r in records if r["round"] == 0 and r["complete"]]
    announced_ms = int(first["created_at"].timestamp() * 1000)
    assert (announced_ms >= straggled[0]) == planned  # with a plan it waited for the stragglers


def test_a_lockstep_rollout_that_runs_out_of_tasks_waits_for_its_last_announced_round_only(tmp_path: Path) -> None:
    settings = config(
        rounds=5,
        lockstep=True,
        round_timeout_s=5.0,
        rollout=BalancedRolloutConfig(budget=2, min_rollouts=2, max_rollouts=2, max_task_outcomes=2),
    )
    events, scheduler = _lockstep_run(tmp_path, settings, caught_up=[True])

    assert (scheduler.rounds_submitted, scheduler.out_of_tasks, scheduler.announced) == (2, True, {0, 1})
    assert scheduler.round == 2 and scheduler.trained_round == 1


def test_lockstep_needs_its_hooks(tmp_path: Path) -> None:
    from orchard.bus import open_bus
    from orchard.config import EmbeddedBusConfig
    from producers.rollout.scheduler import run_rollout_scheduler

    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus, pytest.raises(ValueError, match="LockstepHooks"):
        run_rollout_scheduler(bus, config(lockstep=True), [].append)
