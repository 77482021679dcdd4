"""The GUI task suite: deterministic generation, splits, and every task's grader accepting its reference solution
(replayed through the apps' request handlers) and rejecting a wrong one, judged on the apps' state or the answer."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchard.env.tasks import TaskCatalog
from recipes.gui.apps.core import Request
from recipes.gui.apps.server import AppHost
from recipes.gui.tasks import FAMILIES, GRADER_SOURCE, SuiteConfig, generate, generate_tasks
from tests.unit.recipes.grader_run import plant_forged_results, plant_shadow_modules, run_grader, shadow_imports


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


def graded_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A generated ``booking_cancel`` task and a working copy where the apps persisted its reference solution."""
    generate(SuiteConfig(train_per_family=1, eval_per_family=1), tmp_path / "suite")
    task = TaskCatalog(tmp_path / "suite" / "train").get("gui-booking-cancel-train-000")
    reference = json.loads((tmp_path / "suite" / "references" / f"{task.task_id}.json").read_text())
    work = tmp_path / "work"
    (work / ".gui").mkdir(parents=True)
    world = json.loads((task.workspace / ".gui" / "seed.json").read_text())
    (work / ".gui" / "state.json").write_text(json.dumps(replay(world, [tuple(h) for h in reference["http"]])))
    return task.directory, work


def test_generated_directories_load_as_tasks_and_the_shipped_grader_runs_from_its_own_directory(
    tmp_path: Path,
) -> None:
    task_dir, work = graded_copy(tmp_path)
    catalog = TaskCatalog(task_dir.parent)
    assert len(catalog.tasks) == len(FAMILIES)
    task = catalog.get(task_dir.name)
    assert (task.limits.memory_mb, task.limits.address_space_mb) == (4096, 2**22) and task.labels["app"] == "booking"
    assert not (task.directory / "references").exists()
    assert task.grade_command == 'python3 -I "$ORCHARD_GRADER_DIR/grade.py"'
    assert sorted(p.name for p in task.hidden.iterdir()) == ["expected.json", "grade.py", "seed.json"]
    # the Env's order: the apps persisted their state in the working copy, the grader runs from outside it
    done = run_grader(task.directory, work, tmp_path / "ok")
    assert done.exit_code == 0 and done.signals is not None, done.stderr
    assert done.signals["cancelled"] == 1.0
    (work / ".gui" / "state.json").unlink()  # the apps never started: graded on the seed
    idle = run_grader(task.directory, work, tmp_path / "idle")
    assert idle.exit_code == 1 and idle.signals is not None and idle.signals["cancelled"] == 0.0


def test_planted_modules_and_forged_signals_in_the_working_copy_change_nothing(tmp_path: Path) -> None:
    task_dir, work = graded_copy(tmp_path)
    (work / ".gui" / "state.json").unlink()  # nothing done: a failing episode
    plant_shadow_modules(work)
    plant_shadow_modules(work / ".gui")
    plant_forged_results(work)
    done = run_grader(task_dir, work, tmp_path / "g")
    assert shadow_imports(work) == []
    assert done.exit_code == 1 and done.signals is not None and done.signals["success"] == 0.0, done.stderr
    assert "forged" not in done.signals


@pytest.mark.parametrize("state", ["[]", "{not json", "fifo", "directory"])
def test_a_state_file_that_is_not_a_json_object_fails_the_grade(tmp_path: Path, state: str) -> None:
    task_dir, work = graded_copy(tmp_path)
    path = work / ".gui" / "state.json"
    path.unlink()
    if state == "fifo":
        os.mkfifo(path)
    elif state == "directory":
        path.mkdir()
    else:
        path.write_text(state)
    done = run_grader(task_dir, work, tmp_path / "g", timeout_s=60)
    assert (done.exit_code, done.signals) == (1, {"state_readable": 0.0, "success": 0.0, "progress": 0.0})


def test_an_answer_linked_to_the_graders_own_expectation_is_no_answer(tmp_path: Path) -> None:
    generate(SuiteConfig(train_per_family=1, eval_per_family=1), tmp_path / "suite")
    task = TaskCatalog(tmp_path / "suite" / "train").get("gui-shop-price-train-000")
    expected = tmp_path / "g" / "grader" / "expected.json"  # where run_grader puts it
    work = tmp_path / "work"
    work.mkdir()
    (work / "answer.txt").symlink_to(expected)
    done = run_grader(task.directory, work, tmp_path / "g")
    assert json.loads(expected.read_text())["match"] == "money"  # its first number is the price asked for
    assert done.exit_code == 1 and done.signals is not None, done.stderr
    assert (done.signals["answered"], done.signals["answer_correct"]) == (0.0, 0.0)


def test_without_its_output_directory_the_grader_fails_naming_it(tmp_path: Path) -> None:
    task_dir, work = graded_copy(tmp_path)
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-I", str(task_dir / "hidden" / "grade.py")],
        cwd=work, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "ORCHARD_GRADER_OUT is not set" in done.stderr
