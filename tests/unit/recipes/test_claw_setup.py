"""The Claw recipe's setup stage: tasks and demonstration plans in one idempotent command, solutions kept apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchard.cli.rollout import read_demonstrations
from orchard.engines.scripted import ScriptedPlan
from recipes.claw.setup import SOLUTIONS, main, setup
from recipes.claw.tasks import ClawConfig

SMALL = ClawConfig(train_per_kind=1, eval_per_kind=1, max_steps=12)


def demo_lines(run_dir: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (run_dir / "demos" / "demonstrations.jsonl").read_text().splitlines()]


def test_setup_writes_both_splits_and_a_submittable_plan_per_train_task(tmp_path: Path) -> None:
    tasks, demos = setup(tmp_path, SMALL, episodes_per_task=2, wrong_fraction=0.5)
    train = sorted(p.name for p in (tasks / "train").iterdir())
    assert len(train) == 8 and len(list((tasks / "eval").iterdir())) == 8
    pairs = read_demonstrations(demos)  # what `orchard rollout run --demos` submits
    assert sorted({task for _, task in pairs}) == train and len(pairs) == 16
    for line in demo_lines(tmp_path):
        plan = ScriptedPlan.model_validate(yaml.safe_load((demos / "plans" / f"{line['episode_id']}.yaml").read_text()))
        solution = json.loads((tmp_path / SOLUTIONS / "train" / f"{line['task_id']}.json").read_text())
        calls = [step.tool_calls[0].name for step in plan.steps]
        assert calls == [call["name"] for call in solution[line["solution"]]] + ["submit"]
    assert {line["solution"] for line in demo_lines(tmp_path)} == {"reference", "wrong"}


def test_solutions_and_plans_live_outside_every_task_directory(tmp_path: Path) -> None:
    tasks, demos = setup(tmp_path, SMALL)
    solutions = tmp_path / SOLUTIONS
    assert solutions.is_dir() and not solutions.is_relative_to(tasks / "train")
    for task in [*(tasks / "train").iterdir(), *(tasks / "eval").iterdir()]:
        assert not any("solution" in path.name or path.suffix == ".yaml" and path.name != "task.yaml"
                       for path in task.rglob("*"))  # fmt: skip
    assert not demos.is_relative_to(tasks)


def test_setup_is_idempotent_and_refuses_a_run_directory_generated_with_other_options(tmp_path: Path) -> None:
    setup(tmp_path, SMALL, wrong_fraction=0.0)
    seed = next((tmp_path / "tasks" / "train").iterdir()) / "workspace" / ".claw" / "seed.json"
    before = seed.stat().st_mtime_ns
    (tmp_path / "demos" / "plans" / "stale.yaml").write_text("steps: []\n")
    setup(tmp_path, SMALL, wrong_fraction=1.0)  # the tasks are kept, the plans rewritten
    assert seed.stat().st_mtime_ns == before
    assert not (tmp_path / "demos" / "plans" / "stale.yaml").exists()
    assert {line["solution"] for line in demo_lines(tmp_path)} == {"wrong"}
    with pytest.raises(ValueError, match="other options"):
        setup(tmp_path, SMALL.model_copy(update={"seed": 1}))


def test_a_step_limit_below_the_longest_solution_is_refused_naming_the_task_and_leaves_no_tasks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path / "run"), "--train-per-kind", "1", "--eval-per-kind", "1", "--max-steps", "4"])
    assert exited.value.code == 2
    message = capsys.readouterr().err
    assert "--max-steps 4" in message and "claw-" in message
    assert not (tmp_path / "run" / "tasks").exists()
    assert main([str(tmp_path / "run"), "--train-per-kind", "1", "--eval-per-kind", "1"]) == 0  # the recipe's 12 fit
