"""Stage schema and stage sequencing of ``orchard run`` (no processes: the supervisor's callbacks are recorded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.exceptions import ConfigError
from orchard.run.commands import component_command
from orchard.run.config import parse_run_config
from orchard.run.stages import StageRunner


def recipe(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "components": {
            "env": {"kind": "env", "tasks": "/t", "proxy": "http://127.0.0.1:1"},
            "demos": {"kind": "rollout", "service": "env", "tasks": "/t", "demos": "/d"},
            "check": {"kind": "command", "run": ["python", "{run_dir}/x.py"]},
        },
        "stages": [{"name": "a", "components": ["demos"], "stop": ["env"]}, {"name": "b", "components": ["check"]}],
    }
    data.update(overrides)
    return data


def test_a_stage_naming_an_unknown_component_in_until_is_refused_with_its_field() -> None:
    data = recipe(stages=[{"name": "a", "components": ["demos"], "until": {"exits": ["nope"]}}])
    with pytest.raises(ConfigError, match=r"stages\.0\.until\.exits"):
        parse_run_config(data, "recipe.yaml")


def test_a_stage_without_a_condition_or_a_one_shot_component_runs_until_the_run_is_stopped() -> None:
    config = parse_run_config(recipe(stages=[{"name": "a", "components": ["env"]}]), "recipe.yaml")
    runner = StageRunner(config, probe=None)
    for _ in range(3):
        runner.check({"env": "exited", "demos": "pending", "check": "pending"}, print, print)
    assert runner.current is not None and runner.current.status == "running"


def test_rollout_and_command_components_become_their_commands_with_the_run_dir_filled_in(tmp_path: Path) -> None:
    config = parse_run_config(recipe(), "recipe.yaml")
    rollout = component_command("demos", config.components["demos"], config, tmp_path)
    assert rollout[1:5] == ["rollout", "run", "--env", "http://127.0.0.1:8200"] and "--demos" in rollout
    check = component_command("check", config.components["check"], config, tmp_path)
    assert check[1] == f"{tmp_path.resolve()}/x.py"


def test_stages_start_their_components_in_order_and_end_on_exits_then_stop_what_they_name() -> None:
    config = parse_run_config(recipe(), "recipe.yaml")
    runner, events = StageRunner(config, probe=None), []
    begin, end = (lambda s: events.append(("begin", s.name))), (lambda s: events.append(("end", s.name)))
    statuses = {"env": "healthy", "demos": "pending", "check": "pending"}
    assert runner.may_start("env") and not runner.may_start("demos")
    runner.check(statuses, begin, end)
    assert runner.may_start("demos") and not runner.may_start("check")
    runner.check(statuses, begin, end)
    assert events == [("begin", "a")]
    runner.check({**statuses, "demos": "exited"}, begin, end)
    runner.check({**statuses, "demos": "exited"}, begin, end)
    runner.check({**statuses, "demos": "exited", "check": "exited"}, begin, end)
    assert events == [("begin", "a"), ("end", "a"), ("begin", "b"), ("end", "b")] and runner.finished


def test_a_resumed_run_skips_the_stages_it_completed() -> None:
    config = parse_run_config(recipe(), "recipe.yaml")
    runner = StageRunner(config, None, {"a": {"status": "completed"}})
    assert runner.current is not None and runner.current.config.name == "b"
