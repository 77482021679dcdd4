"""What a resumed ``orchard run`` keeps from the start it continues, and how stage conditions read a shared bus.

The supervisor is driven by hand (``step``) with process starts recorded instead of made; the bus probe reads an
embedded bus in a temporary directory (no service).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.run.config import parse_run_config
from orchard.run.rundir import RunDir
from orchard.run.stages import BusProbe
from orchard.run.supervisor import ComponentState, Supervisor
from orchard.topics import POLICY_VERSIONS, SAMPLES
from trainers.synthetic import synthetic_sample

RECIPE: dict[str, Any] = {
    "components": {
        "env": {"kind": "env", "tasks": "/t", "proxy": "http://127.0.0.1:1"},
        "demos": {"kind": "rollout", "service": "env", "tasks": "/t", "demos": "/d"},
        "rollout": {"kind": "rollout", "service": "http://127.0.0.1:2", "tasks": "/t"},
        "trainer": {"kind": "policy-trainer"},
        "check": {"kind": "command", "run": ["python", "-c", "pass"]},
        "watcher": {"kind": "consumer", "name": "assembler", "after": ["env"]},  # unstaged, started with the run
    },
    "stages": [
        {"name": "demos", "components": ["demos"], "stop": ["env"]},
        {"name": "rl", "components": ["rollout", "trainer"], "until": {"exits": ["rollout", "trainer"]}},
        {"name": "check", "components": ["check"]},
    ],
}


def resumed_supervisor(tmp_path: Path, rl_status: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Supervisor, list[str]]:
    """A supervisor resuming a run stopped during stage ``rl`` (its rollout had exited 0); starts are recorded."""
    stages = [{"name": "demos", "status": "completed"}, {"name": "rl", "status": rl_status}, {"name": "check"}]
    components = {"env": {"status": "stopped", "exit_code": -15}, "rollout": {"status": "exited", "exit_code": 0},
                  "trainer": {"status": "stopped", "exit_code": -15}}  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps({"stages": stages, "components": components, "starts": 1}))
    started: list[str] = []

    def spawn(self: Supervisor, state: ComponentState) -> None:
        started.append(state.name)
        state.status = "healthy"

    monkeypatch.setattr(Supervisor, "_spawn", spawn)
    supervisor = Supervisor(parse_run_config(RECIPE, "recipe.yaml"), RunDir(tmp_path), {}, resumed=1)
    return supervisor, started


def test_a_resume_keeps_stopped_what_a_completed_stage_stopped_and_does_not_rerun_what_finished_in_the_stopped_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, started = resumed_supervisor(tmp_path, "running", monkeypatch)
    try:
        for _ in range(3):
            supervisor.step()
    finally:
        supervisor._http.close()
    assert started == ["watcher", "trainer"]  # the watcher needed env before the stop, not after it
    assert supervisor.components["env"].status == "stopped"
    assert (supervisor.components["rollout"].status, supervisor.components["rollout"].exit_code) == ("exited", 0)
    assert [(s.config.name, s.status) for s in supervisor.stages.stages][:2] == [
        ("demos", "completed"),
        ("rl", "running"),
    ]


def test_a_component_that_exited_before_its_stage_began_runs_when_the_resumed_run_begins_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, started = resumed_supervisor(tmp_path, "pending", monkeypatch)
    try:
        for _ in range(3):
            supervisor.step()
    finally:
        supervisor._http.close()
    assert sorted(started) == ["rollout", "trainer", "watcher"]


def test_env_gets_time_to_publish_the_outcomes_of_the_episodes_it_cancels_when_stopped() -> None:
    config = parse_run_config(RECIPE, "recipe.yaml")
    assert config.components["env"].stop_grace_s == 60.0 and config.components["trainer"].stop_grace_s == 10.0


def test_stage_conditions_count_only_this_runs_records_of_a_shared_topic(tmp_path: Path) -> None:
    config = EmbeddedBusConfig(path=tmp_path / "bus")
    codec = Codec.default()
    bus = open_bus(config)
    probe = BusProbe(config, "mine")
    try:
        assert probe.count(SAMPLES) == 0 and probe.policy_version() is None  # no topic yet
        bus.create_topic(SAMPLES, 2)
        with bus.producer() as producer:
            for index, run_id in enumerate(["other", "mine", "other", "mine", "other"]):
                producer.send(SAMPLES, codec.encode("TrainingSample", synthetic_sample(index, run_id=run_id)))
            producer.send(SAMPLES, b"not an orchard record")  # cannot be another run's: it counts
            for run_id, version in (("other", 7), ("mine", 2), ("mine", 1)):
                record = {"run_id": run_id, "model": "policy", "version": version, "uri": "u", "sha256": "s",
                          "trainer_step": version, "metrics": {}, "created_at": 0}  # fmt: skip
                producer.send(POLICY_VERSIONS, codec.encode("PolicyVersion", record))
        assert probe.count(SAMPLES) == 3
        assert probe.policy_version() == 2
        with bus.producer() as producer:
            producer.send(SAMPLES, codec.encode("TrainingSample", synthetic_sample(9, run_id="mine")))
        assert probe.count(SAMPLES) == 4  # read on from where the last check stopped
    finally:
        probe.close()
        bus.close()
