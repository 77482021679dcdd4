"""The GUI task suite: deterministic generation, splits, and every task's grader accepting its reference solution
(replayed through the apps' request handlers) and rejecting a wrong one, judged on the apps' state or the answer."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from orchard.env.tasks import TaskCatalog
from recipes.gui.apps.core import Request
from recipes.gui.apps.server import AppHost
from recipes.gui.tasks import FAMILIES, GRADER_SOURCE, SuiteConfig, generate, generate_tasks


def _grader() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gui_grade", GRADER_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GRADER = _grader()
TASKS = generate_tasks(SuiteConfig())


def replay(world: dict[str, Any], http: list[tuple[str, str, dict[str, str]]]) -> dict[str, Any]:
    """The apps' state after ``http`` (each a state-changing POST, answered 303)."""
    host = AppHost(copy.deepcopy(world), None)
    for method, path, form in http:
        response = host.handle(Request(method, path, {}, form))
        assert (response.status, response.changed) == (303, True), response.body[-400:]
    return host.state


def test_the_suite_has_at_least_sixty_tasks_over_every_family_with_a_held_out_split() -> None:
    assert len(TASKS) == 70 and len({t.task_id for t in TASKS}) == 70
    for split, count in (("train", 5), ("eval", 2)):
        families = [t.family for t in TASKS if t.split == split]
        assert sorted(set(families)) == sorted(FAMILIES) and len(families) == count * len(FAMILIES)
    worlds = {
        split: {json.dumps(t.world, sort_keys=True) for t in TASKS if t.split == split} for split in ("train", "eval")
    }
    assert not worlds["train"] & worlds["eval"]
    assert [t.instruction for t in generate_tasks(SuiteConfig())] == [t.instruction for t in TASKS]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_every_grader_accepts_its_reference_and_rejects_a_wrong_solution(task: Any) -> None:
    good = GRADER.grade(task.expected, task.world, replay(task.world, task.http), task.answer)
    assert good["success"] == 1.0 and good["progress"] == 1.0, good
    assert task.wrong_http or task.wrong_answer is not None
    wrong_answer = task.wrong_answer if task.wrong_answer is not None else task.answer
    bad = GRADER.grade(task.expected, task.world, replay(task.world, task.wrong_http), wrong_answer)
    assert bad["success"] == 0.0 and bad["progress"] < 1.0, bad


def test_an_idle_episode_fails_every_state_task_and_a_side_effect_fails_an_answer_task() -> None:
    for task in TASKS:
        if task.expected["kind"] != "answer":
            assert GRADER.grade(task.expected, task.world, task.world, None)["success"] == 0.0, task.task_id
    task = next(t for t in TASKS if t.family == "shop_price")
    some_sku = next(p["sku"] for p in task.world["shop"]["products"] if p["in_stock"])
    checkout = {"name": "A", "address": "B", "shipping": "standard"}
    state = replay(task.world, [("POST", "/shop/cart/add", {"sku": some_sku}), ("POST", "/shop/checkout", checkout)])
    signals = GRADER.grade(task.expected, task.world, state, task.answer)
    assert (signals["answer_correct"], signals["no_side_effects"], signals["success"]) == (1.0, 0.0, 0.0)


def test_a_booking_grader_gives_partial_credit_for_the_right_room_at_the_wrong_time() -> None:
    task = next(t for t in TASKS if t.family == "booking_slot")
    signals = GRADER.grade(task.expected, task.world, replay(task.world, task.wrong_http), None)
    assert (signals["booked"], signals["right_room"], signals["right_time"], signals["right_party"]) == (1, 1, 0, 1)
    assert signals["progress"] == 0.75


def test_generated_directories_load_as_tasks_and_the_shipped_grader_runs_in_a_working_copy(tmp_path: Path) -> None:
    config = SuiteConfig(train_per_family=1, eval_per_family=1)
    generate(config, tmp_path / "suite")
    catalog = TaskCatalog(tmp_path / "suite" / "train")
    assert len(catalog.tasks) == len(FAMILIES)
    task = catalog.get("gui-booking-cancel-train-000")
    assert task.limits.memory_mb >= 2**21 and task.labels["app"] == "booking"
    assert not (task.directory / "references").exists()
    reference = json.loads((tmp_path / "suite" / "references" / f"{task.task_id}.json").read_text())
    assert yaml.safe_load((task.directory / "task.yaml").read_text())["grade_command"] == "python3 .grader/grade.py"
    # the Env's order: the workspace is the working copy, the apps persisted their state, then hidden/ is copied in
    work = tmp_path / "work"
    (work / ".gui").mkdir(parents=True)
    world = json.loads((task.workspace / ".gui" / "seed.json").read_text())
    (work / ".gui" / "state.json").write_text(json.dumps(replay(world, [tuple(h) for h in reference["http"]])))
    (work / ".grader").mkdir()
    for path in (task.hidden / ".grader").iterdir():
        (work / ".grader" / path.name).write_bytes(path.read_bytes())
    done = subprocess.run([sys.executable, ".grader/grade.py"], cwd=work, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((work / ".orchard-signals.json").read_text())["cancelled"] == 1.0
    (work / ".gui" / "state.json").unlink()  # the apps never started: graded on the seed
    idle = subprocess.run([sys.executable, ".grader/grade.py"], cwd=work, capture_output=True, check=False)
    assert idle.returncode == 1
