"""The GUI recipe's setup stage: the chosen families' tasks with references kept outside the task directories, the
expert's plans (the first demonstration of a task replays the reference, later ones may be imperfect with a known
grade), idempotent on the same options and refusing others."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.engines.scripted import ScriptedPlan
from recipes.gui.apps.core import Request
from recipes.gui.apps.server import AppHost
from recipes.gui.setup import (
    CPU_FAMILIES,
    DemoConfig,
    GuiSetupConfig,
    demo_actions,
    demo_kind,
    demo_plan,
    main,
    setup,
    suite_tasks,
)
from recipes.gui.tasks import GRADER_SOURCE, SuiteConfig, generate_tasks, make_task

SMALL = GuiSetupConfig(suite=SuiteConfig(train_per_family=2, eval_per_family=1), families=CPU_FAMILIES)


def _grader() -> Any:
    spec = importlib.util.spec_from_file_location("gui_grade_setup", GRADER_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRADER = _grader()


def test_setup_writes_the_chosen_families_with_references_outside_the_tasks_and_plans_each_demonstration(
    tmp_path: Path,
) -> None:
    tasks, demos = setup(tmp_path, SMALL, DemoConfig(failing_fraction=1.0))
    train = sorted(p.name for p in (tasks / "train").iterdir())
    assert len(train) == 8 and len(list((tasks / "eval").iterdir())) == 4
    assert {name.split("-train-")[0] for name in train} == {"gui-" + f.replace("_", "-") for f in CPU_FAMILIES}
    assert sorted(p.stem for p in (tmp_path / "references").iterdir()) == sorted(
        json.loads((tasks / "manifest.json").read_text())["splits"]["train"]
        + json.loads((tasks / "manifest.json").read_text())["splits"]["eval"]
    )
    assert not list(tasks.rglob("references"))  # no reference inside a task directory
    lines = [json.loads(line) for line in (demos / "demonstrations.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and [line["kind"] for line in lines[::2]] == ["reference"] * 8
    assert {line["kind"] for line in lines[1::2]} == {"wrong_target", "wrong_answer"}
    plan = ScriptedPlan.from_file(demos / "plans" / f"{lines[0]['episode_id']}.yaml")
    assert plan.model == "gui-expert" and [s.tool_calls[0].name for s in plan.steps] == ["navigate", "click", "answer"]


def test_setup_keeps_its_tasks_on_the_same_options_and_refuses_others(tmp_path: Path) -> None:
    setup(tmp_path, SMALL, DemoConfig())
    manifest = (tmp_path / "tasks" / "manifest.json").stat().st_mtime_ns
    setup(tmp_path, SMALL, DemoConfig(episodes_per_task=1))  # plans are rewritten, tasks kept
    assert (tmp_path / "tasks" / "manifest.json").stat().st_mtime_ns == manifest
    assert len(list((tmp_path / "demos" / "plans").iterdir())) == 8  # no plan of the earlier options lingers
    with pytest.raises(ValueError, match="generated with other options"):
        setup(tmp_path, GuiSetupConfig(suite=SMALL.suite, families=("docs_error",)), DemoConfig())


def test_unknown_families_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="shop_teleport"):
        GuiSetupConfig(families=("shop_teleport",))


@pytest.mark.parametrize("family", ["booking_cancel", "docs_setting", "shop_price", "shop_cheapest", "booking_slot"])
def test_each_demonstration_kind_gets_the_grade_it_is_planned_for(family: str) -> None:
    """The planned actions, applied as their HTTP equivalents, grade as the kind says."""
    task = make_task(family, "train", 0, seed=0)
    expected = {"reference": 1.0, "wrong_answer": 0.0, "wrong_target": 0.0, "quit": 0.0}
    kind = demo_kind(task, 1, DemoConfig(failing_fraction=1.0))
    assert kind == {"booking_cancel": "wrong_target", "docs_setting": "wrong_answer", "shop_price": "wrong_answer"}.get(
        family, "quit"
    )
    for planned in ("reference", kind):
        actions, answer = demo_actions(task, planned)
        if planned == "reference":
            http = task.http
        elif planned == "wrong_target":
            http = task.wrong_http
        else:
            http = []  # a wrong answer changes nothing; quitting stops before the decisive action
        state = _apply(task, http)
        assert GRADER.grade(task.expected, task.world, state, answer)["success"] == expected[planned], planned
        plan = demo_plan(task, planned)
        calls = [step.tool_calls[0].name for step in plan.steps if step.tool_calls]
        assert calls == [a["tool"] for a in actions]
        assert (plan.steps[-1].tool_calls == []) == (planned == "quit")


def _apply(task: Any, http: list[Any]) -> dict[str, Any]:
    """The apps' state after ``http`` (state-changing POSTs), handled in process."""
    host = AppHost(copy.deepcopy(task.world), None)
    for method, path, form in http:
        assert host.handle(Request(method, path, {}, form)).status == 303
    return host.state


def test_the_first_demonstration_always_replays_the_reference_and_the_choice_is_seeded() -> None:
    task = make_task("docs_error", "train", 0, seed=0)
    assert demo_kind(task, 0, DemoConfig(failing_fraction=1.0)) == "reference"
    tasks = [make_task("docs_error", "train", i, seed=0) for i in range(3)]
    kinds = [demo_kind(t, i, DemoConfig(failing_fraction=0.5, seed=7)) for t in tasks for i in range(1, 30)]
    assert kinds == [demo_kind(t, i, DemoConfig(failing_fraction=0.5, seed=7)) for t in tasks for i in range(1, 30)]
    assert 20 < kinds.count("wrong_answer") < 67


def test_the_command_line_takes_the_cpu_families(tmp_path: Path) -> None:
    argv = [str(tmp_path), "--families", "cpu", "--train-per-family", "1", "--eval-per-family", "1", "--max-steps", "6"]
    assert main(argv) == 0
    manifest = json.loads((tmp_path / "tasks" / "manifest.json").read_text())
    assert manifest["config"]["families"] == list(CPU_FAMILIES) and manifest["config"]["suite"]["max_steps"] == 6
    spec = yaml.safe_load((tmp_path / "tasks" / "eval" / manifest["splits"]["eval"][0] / "task.yaml").read_text())
    assert spec["max_steps"] == 6


def test_the_chosen_families_are_the_suites_own_tasks_in_its_order() -> None:
    suite_config = SuiteConfig(train_per_family=1, eval_per_family=1)
    config = GuiSetupConfig(suite=suite_config, families=("shop_price", "docs_error"))
    suite = [t.task_id for t in generate_tasks(config.suite) if t.family in config.families]
    assert [t.task_id for t in suite_tasks(config)] == suite
