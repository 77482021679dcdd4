"""A stage's start time handed to the components it starts (kept across a resume), and a stage that waits until
every trajectory published since it began has the scores of the named scorers (``until.scored_by``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from consumers.start import STAGE_STARTED_ENV
from consumers.synthetic import synthetic_episode
from orchard.bus import Bus, open_bus
from orchard.bus.base import partition_for_key
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.exceptions import ConfigError
from orchard.run import stages
from orchard.run.config import parse_run_config
from orchard.run.rundir import RunDir
from orchard.run.stages import BusProbe, StageRunner
from orchard.run.supervisor import Supervisor
from orchard.topics import DEAD_LETTERS, SCORES, TRAJECTORIES
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()
RECIPE: dict[str, Any] = {
    "components": {
        "env": {"kind": "env", "tasks": "/t", "proxy": "http://127.0.0.1:1"},
        "rollout": {"kind": "rollout", "service": "env", "tasks": "/t"},
        "scorer": {"kind": "consumer", "name": "rule_process_reward", "args": ["--start", "stage"]},
    },
    "stages": [
        {"name": "setup", "components": ["env"], "until": {"exits": ["env"]}},
        {
            "name": "dense",
            "components": ["rollout", "scorer"],
            "until": {"exits": ["rollout"], "scored_by": ["rule", "distil"]},
        },
    ],  # fmt: skip
}


def begin_dense(runner: StageRunner) -> None:
    """Complete ``setup`` and begin ``dense``."""
    for statuses in ({"env": "healthy"}, {"env": "exited"}, {"env": "exited"}):
        runner.check({"rollout": "pending", "scorer": "pending", **statuses}, print, print)
    assert runner.current is not None and runner.current.config.name == "dense"


def test_the_components_a_stage_starts_learn_when_it_began() -> None:
    runner = StageRunner(parse_run_config(RECIPE, "recipe.yaml"), probe=None)
    before = int(time.time() * 1000)
    begin_dense(runner)

    env = runner.stage_env("scorer")
    assert env["ORCHARD_STAGE"] == "dense"
    assert before <= int(env[STAGE_STARTED_ENV]) <= int(time.time() * 1000)
    assert runner.stage_env("rollout") == env
    assert runner.stage_env("env") == {}  # not a component of the running stage


def test_a_resumed_stage_passes_on_the_time_it_first_began() -> None:
    previous = {"setup": {"status": "completed"}, "dense": {"status": "running", "started_at": 1_700_000_000.5}}
    runner = StageRunner(parse_run_config(RECIPE, "recipe.yaml"), None, previous)
    runner.check({"env": "exited", "rollout": "pending", "scorer": "pending"}, print, print)

    assert runner.stage_env("scorer")[STAGE_STARTED_ENV] == "1700000000500"
    assert [(s["name"], s.get("first_started_at")) for s in runner.public()] == [
        ("setup", None), ("dense", 1_700_000_000.5),
    ]  # fmt: skip


def test_the_supervisor_starts_a_stages_components_with_its_start_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs: dict[str, dict[str, str]] = {}

    class Running:
        pid = 2**22 + 17  # no such process: never signalled in this test

        @staticmethod
        def poll() -> None:
            return None

    def popen(self: Supervisor, command: list[str], env: dict[str, str], logfile: object) -> Running:
        envs[command[command.index("run") + 1] if "consumer" in command else command[1]] = env
        return Running()

    monkeypatch.setattr(Supervisor, "_popen", popen)
    (tmp_path / "logs").mkdir()
    supervisor = Supervisor(parse_run_config(RECIPE, "recipe.yaml"), RunDir(tmp_path), {"BASE": "1"})
    supervisor.stages.stages[0].status = "completed"
    for _ in range(3):
        supervisor.step()

    assert envs["rule_process_reward"]["BASE"] == "1"
    assert envs["rule_process_reward"][STAGE_STARTED_ENV] == str(supervisor.stages.stages[1].since_ms)


def test_a_stage_until_may_be_only_its_scores_and_names_scorers() -> None:
    only_scores = RECIPE | {"stages": [{"name": "dense", "components": ["rollout"], "until": {"scored_by": ["x"]}}]}
    assert parse_run_config(only_scores, "recipe.yaml").stages[0].until.scored_by == ["x"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="scored_by"):
        parse_run_config(RECIPE | {"stages": [{"name": "d", "components": [], "until": {}}]}, "recipe.yaml")


def publish(
    bus: Bus,
    trajectories: list[tuple[str, str, int, str]],
    scores: list[tuple[str, str]],
    letters: Sequence[tuple[str, str]] = (),
) -> None:
    """Trajectories (run, episode, bus timestamp, calls: "all", "none" or "unusable": an incomplete one whose calls
    all miss their base), StepScores (episode, scorer) of run ``mine``, and dead letters (episode, consumer group) of
    trajectories published by the same call. Trajectories and scores are keyed by task ("t", as the assembler and
    the reward consumer key them), so a letter finds its trajectory by partition and offset."""
    for topic in (TRAJECTORIES, SCORES, DEAD_LETTERS):
        bus.create_topic(topic, 2, exist_ok=True)
    partition = partition_for_key(b"t", 2)
    offsets = {episode_id: i for i, (_, episode_id, _, _) in enumerate(trajectories)}  # one partition, a fresh bus
    with bus.producer() as producer:
        for run_id, episode_id, timestamp, calls in trajectories:
            episode = synthetic_episode(episode_id, calls=3, seed=1, run_id=run_id)
            values = {"all": [c.value for c in episode.calls], "none": [], "unusable": [episode.calls[2].value]}
            record = trajectory_record(
                run_id=run_id, episode_id=episode_id, task_id="t", calls=values[calls], outcome=None,
                outcome_fields=None, policy_version=1, timestamp_ms=timestamp,
                incomplete_reason=None if calls == "all" else "no outcome",
            )  # fmt: skip
            if calls == "all":
                record |= {"outcome": episode.outcome.value, "complete": True}
            value = CODEC.encode("Trajectory", record)
            producer.produce(TRAJECTORIES, value, b"t", timestamp_ms=timestamp)
        for episode_id, scorer in scores:
            record = {"run_id": "mine", "episode_id": episode_id, "call_index": 1, "scorer": scorer,
                      "policy_version": 1, "score": 0.5, "timestamp": 0}  # fmt: skip
            producer.produce(SCORES, CODEC.encode("StepScore", record), b"t")
        for episode_id, group in letters:
            letter = {"original": b"", "source_topic": TRAJECTORIES, "source_partition": partition,
                      "source_offset": offsets[episode_id], "source_key": b"t", "reason": "teacher unreachable",
                      "error_type": "HTTPError", "consumer_group": group, "timestamp": 0}  # fmt: skip
            producer.produce(DEAD_LETTERS, CODEC.encode("DeadLetter", letter), b"t")


def test_the_stage_is_done_once_every_trajectory_since_it_began_has_every_scorers_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stages, "PROBE_EVERY_S", 0.0)
    config = EmbeddedBusConfig(path=tmp_path / "bus")
    bus = open_bus(config)
    probe = BusProbe(config, "mine")
    runner = StageRunner(parse_run_config(RECIPE, "recipe.yaml"), probe)
    ended: list[str] = []
    try:
        begin_dense(runner)
        since = runner.stages[1].since_ms or 0
        publish(bus, [("mine", "earlier", since - 5_000, "all"), ("other", "theirs", since + 1, "all"),
                      ("mine", "no-calls", since + 2, "none"), ("mine", "unusable", since + 2, "unusable"),
                      ("mine", "e1", since + 3, "all"), ("mine", "e2", since + 4, "all"),
                      ("mine", "e3", since + 5, "all")],
                [("e1", "rule"), ("e1", "distil"), ("e2", "rule"), ("e3", "rule")],
                [("e3", "reward-distil"), ("e2", "reward-rule")])  # fmt: skip
        done = {"env": "exited", "rollout": "exited", "scorer": "healthy"}

        assert probe.unscored(["rule", "distil"], since) == ["e2"]
        runner.check(done, print, ended.append)
        assert ended == []  # the rollout is done, e2 still lacks its distillation score (e3's was dead-lettered)
        publish(bus, [], [("e2", "distil")])
        assert probe.unscored(["rule", "distil"], since) == []
        runner.check(done, print, lambda stage: ended.append(stage.name))
        assert ended == ["dense"]
    finally:
        runner.close()
        bus.close()


def test_scores_are_not_taken_as_complete_before_the_topics_are_read_to_their_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EmbeddedBusConfig(path=tmp_path / "bus")
    bus = open_bus(config)
    probe = BusProbe(config, "mine")
    try:
        publish(bus, [("mine", "e1", 5_000, "all")], [])
        monkeypatch.setattr(stages, "READ_BUDGET_S", 0.0)  # nothing gets read
        assert probe.unscored(["rule"], 1_000) is None
        monkeypatch.setattr(stages, "READ_BUDGET_S", 0.25)
        assert probe.unscored(["rule"], 1_000) == ["e1"]
        assert probe.unscored(["rule"], 6_000) == []  # another stage: e1 came before it
    finally:
        probe.close()
        bus.close()
