"""Stage schema and stage sequencing of ``orchard run`` (no processes: the supervisor's callbacks are recorded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.exceptions import ConfigError
from orchard.run import stages
from orchard.run.commands import component_command
from orchard.run.config import parse_run_config
from orchard.run.stages import BusProbe, StageRunner


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


def rollout_command(tmp_path: Path, **fields: object) -> tuple[list[str], list[str]]:
    """The command of a rollout component ``rl`` with ``fields``, and the recipe's demos component's command."""
    parts = recipe()["components"]
    parts["rl"] = {"kind": "rollout", "service": "env", "tasks": "/t", **fields}
    config = parse_run_config(recipe(components=parts), "recipe.yaml")
    demos = component_command("demos", config.components["demos"], config, tmp_path)
    return component_command("rl", config.components["rl"], config, tmp_path), demos


def test_a_rollouts_task_outcome_cap_reaches_its_command_and_the_cli_accepts_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchard.cli.main import app

    command, demos = rollout_command(tmp_path, rounds=3, max_task_outcomes=8)
    assert command[command.index("--max-task-outcomes") + 1] == "8"
    assert "--max-task-outcomes" not in demos
    usage = CliRunner().invoke(app, ["rollout", "run", "--help"], terminal_width=200)
    assert "--max-task-outcomes" in usage.output


def test_a_rollouts_new_policy_wait_reaches_its_command_and_the_cli_refuses_it_for_demos(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchard.cli.main import app

    command, demos = rollout_command(tmp_path, rounds=3, new_policy_wait_s=30)
    assert command[command.index("--new-policy-wait") + 1] == "30.0"
    assert "--new-policy-wait" not in demos
    assert "--prior-successes" not in command  # the uniform prior is the CLI's default
    (tmp_path / "tasks").mkdir()
    (tmp_path / "demos").mkdir()
    refused = CliRunner().invoke(
        app,
        ["rollout", "run", "--env", "http://127.0.0.1:9", "--tasks", str(tmp_path / "tasks"), "--demos",
         str(tmp_path / "demos"), "--new-policy-wait", "5"],
        env={"ORCHARD_ENV_TOKEN": "t"},
    )  # fmt: skip
    assert refused.exit_code != 0
    assert "--new-policy-wait, --lockstep and --seed apply to rollout rounds" in str(refused.output) + str(
        refused.exception
    )


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


def test_a_stage_until_a_group_caught_up_ends_once_it_committed_past_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stages, "PROBE_EVERY_S", 0.0)
    until = {"exits": ["demos"], "caught_up": ["sample-builder-sft"]}
    config = parse_run_config(recipe(stages=[{"name": "a", "components": ["demos"], "until": until}]), "recipe.yaml")
    assert config.stages[0].until is not None and config.stages[0].until.reads_bus
    bus_config = EmbeddedBusConfig(path=tmp_path / "bus")
    bus = open_bus(bus_config)
    runner, ended = StageRunner(config, BusProbe(bus_config, "r")), []
    try:
        bus.create_topic("trajectories", 2)
        with bus.producer() as producer:
            for index in range(3):
                producer.produce("trajectories", f"t{index}".encode(), f"k{index}".encode())
        statuses = {"env": "healthy", "demos": "exited", "check": "pending"}
        runner.check(statuses, print, lambda stage: ended.append(stage.name))  # begins the stage
        builder = bus.consumer(["trajectories"], "sample-builder-sft")
        builder.poll(max_records=2, timeout_s=1.0)
        builder.commit()
        runner.check(statuses, print, lambda stage: ended.append(stage.name))
        assert ended == []  # the builder has a record of the stage's to process
        while len(builder.poll(max_records=10, timeout_s=0.2)):
            pass
        builder.commit()
        runner.check(statuses, print, lambda stage: ended.append(stage.name))
        assert ended == ["a"]
        builder.close()
    finally:
        runner.close()
        bus.close()


def test_caught_up_alone_is_a_condition() -> None:
    only = recipe(stages=[{"name": "a", "components": ["demos"], "until": {"caught_up": ["g"]}}])
    assert parse_run_config(only, "recipe.yaml").stages[0].until.caught_up == ["g"]  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="caught_up"):
        parse_run_config(recipe(stages=[{"name": "a", "components": [], "until": {}}]), "recipe.yaml")


def test_a_rollouts_bar_prior_and_aim_reach_its_command_and_the_cli_accepts_them(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchard.cli.main import app

    command, _ = rollout_command(tmp_path, prior_successes=8, prior_failures=2, aim="failing")
    assert command[command.index("--prior-successes") + 1] == "8.0"
    assert command[command.index("--prior-failures") + 1] == "2.0"
    assert command[command.index("--aim") + 1] == "failing"
    usage = CliRunner().invoke(app, ["rollout", "run", "--help"], terminal_width=200)
    assert "--prior-successes" in usage.output and "--prior-failures" in usage.output
