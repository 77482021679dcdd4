"""The Claw task suite: deterministic, disjoint train and held-out splits of loadable tasks of every kind, solutions
kept out of the task directories; every task's grader accepts its reference solution and rejects its wrong one
(judged on the services' final state); the expert's plans carry out the solutions."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchard.env.tasks import TaskCatalog
from recipes.claw.expert import choose, solution_plan, write_demonstrations
from recipes.claw.services import STATE_FILE, BackgroundServices
from recipes.claw.tasks import GRADE_SCRIPT, KINDS, SOLUTIONS_DIR, ClawConfig, generate, load_solutions
from recipes.claw.tools import TOOLS_BY_NAME, call_tool
from tests.unit.recipes.grader_run import plant_forged_results, plant_shadow_modules, run_grader, shadow_imports

CONFIG = ClawConfig()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default suite, generated once."""
    out = tmp_path_factory.mktemp("claw") / "tasks"
    generate(CONFIG, out)
    return out


@pytest.fixture(scope="module")
def grader() -> ModuleType:
    """The grader script as a module (it is what each task ships at the top of hidden/)."""
    spec = importlib.util.spec_from_file_location("claw_grade", GRADE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def all_tasks(config: ClawConfig = CONFIG) -> list[tuple[str, str]]:
    """(split, task id) of every task the default config generates."""
    return [
        (split, f"claw-{split}-{kind.replace('_', '-')}-{index:03d}")
        for split, per_kind in (("train", config.train_per_kind), ("eval", config.eval_per_kind))
        for kind in KINDS
        for index in range(per_kind)
    ]


def apply(suite: Path, split: str, task_id: str, calls: list[dict[str, Any]], workdir: Path) -> list[Any]:
    """A fresh working copy of the task with ``calls`` run against its services; the answers."""
    shutil.copytree(suite / split / task_id / "workspace", workdir)
    answers = []
    with BackgroundServices(workdir) as services:
        for item in calls:
            ok, answer = call_tool(services.url, item["name"], item["arguments"])
            assert ok, (item, answer)
            answers.append(answer)
    return answers


def test_the_suite_has_at_least_60_loadable_tasks_of_every_kind_in_both_splits(suite: Path) -> None:
    manifest = json.loads((suite / "manifest.json").read_text())
    assert len(manifest["kinds"]) == len(all_tasks()) >= 60
    for split in ("train", "eval"):
        catalog = TaskCatalog(suite / split)
        assert sorted(catalog.tasks) == sorted(manifest["splits"][split])
        assert {task.labels["kind"] for task in catalog.tasks.values()} == set(KINDS)
        assert all(task.labels["split"] == split for task in catalog.tasks.values())


def test_held_out_tasks_share_no_instruction_or_world_with_train_tasks(suite: Path) -> None:
    def worlds(split: str) -> set[str]:
        return {
            (d / "workspace" / ".claw" / "seed.json").read_text() + (d / "task.yaml").read_text().split("\n")[1]
            for d in (suite / split).iterdir()
        }

    assert not worlds("train") & worlds("eval")
    assert len(worlds("train")) == len(list((suite / "train").iterdir()))


def test_the_same_config_writes_byte_identical_trees_and_another_seed_does_not(tmp_path: Path, suite: Path) -> None:
    generate(CONFIG, tmp_path / "again")
    assert tree(tmp_path / "again") == tree(suite)
    generate(ClawConfig(seed=1, train_per_kind=1, eval_per_kind=1), tmp_path / "other")
    assert tree(tmp_path / "other" / "eval") != {
        path: data for path, data in tree(suite / "eval").items() if "-000/" in path
    }


def test_solutions_stay_outside_the_task_directories(suite: Path) -> None:
    for split, task_id in all_tasks():
        solutions = load_solutions(suite, split, task_id)
        assert solutions["reference"] and solutions["wrong"] and solutions["reference"] != solutions["wrong"]
        assert {call["name"] for call in solutions["reference"] + solutions["wrong"]} <= set(TOOLS_BY_NAME)
        task_files = tree(suite / split / task_id)
        assert not any("solution" in path for path in task_files)
        # the wrong outcome is described in the solutions file only
        assert not any(solutions["wrong_outcome"].encode() in data for data in task_files.values())
    assert (suite / SOLUTIONS_DIR).is_dir()


@pytest.mark.parametrize(("split", "task_id"), all_tasks())
def test_the_grader_accepts_the_reference_solution_and_rejects_the_wrong_one(
    suite: Path, grader: ModuleType, tmp_path: Path, split: str, task_id: str
) -> None:
    solutions = load_solutions(suite, split, task_id)
    hidden = suite / split / task_id / "hidden"
    apply(suite, split, task_id, solutions["reference"], tmp_path / "good")
    success, signals, effects = grader.grade(tmp_path / "good", hidden)
    assert (success, effects, signals["progress"]) == (True, [], 1.0), signals

    apply(suite, split, task_id, solutions["wrong"], tmp_path / "bad")
    success, signals, effects = grader.grade(tmp_path / "bad", hidden)
    assert not success, (solutions["wrong_outcome"], signals)
    assert 0.0 <= signals["progress"] < 1.0


def test_doing_nothing_fails_every_kind_with_no_side_effects(suite: Path, grader: ModuleType, tmp_path: Path) -> None:
    for kind in KINDS:
        task_id = f"claw-eval-{kind.replace('_', '-')}-000"
        workdir = tmp_path / kind
        shutil.copytree(suite / "eval" / task_id / "workspace", workdir)
        success, signals, effects = grader.grade(workdir, suite / "eval" / task_id / "hidden")
        assert (success, effects, signals["no_side_effects"]) == (False, [], 1.0), kind
        assert signals["progress"] < 1.0


def test_the_shipped_grader_runs_from_its_own_directory_and_writes_its_signals_out(suite: Path, tmp_path: Path) -> None:
    task_dir = suite / "train" / "claw-train-triage-000"
    assert sorted(p.name for p in (task_dir / "hidden").iterdir()) == ["check.json", "grade.py", "seed.json"]
    workdir = tmp_path / "work"
    apply(suite, "train", task_dir.name, load_solutions(suite, "train", task_dir.name)["reference"], workdir)
    run = run_grader(task_dir, workdir, tmp_path / "ok")
    assert run.exit_code == 0 and run.signals is not None, run.stderr
    assert (run.signals["triaged"], run.signals["progress"], run.signals["side_effects"]) == (1.0, 1.0, 0.0)

    (workdir / STATE_FILE).write_text("{not json")
    run = run_grader(task_dir, workdir, tmp_path / "bad")
    assert run.exit_code == 1 and run.signals is not None and run.signals["progress"] == 0.0


def test_planted_modules_and_forged_signals_in_the_working_copy_change_nothing(suite: Path, tmp_path: Path) -> None:
    task_dir = suite / "train" / "claw-train-triage-000"
    workdir = tmp_path / "work"
    shutil.copytree(task_dir / "workspace", workdir)  # nothing done: a failing episode
    plant_shadow_modules(workdir)
    plant_shadow_modules(workdir / ".claw")
    plant_forged_results(workdir)
    run = run_grader(task_dir, workdir, tmp_path / "g")
    assert shadow_imports(workdir) == []
    assert run.exit_code == 1 and run.signals is not None and run.signals["triaged"] == 0.0, run.stderr
    assert "forged" not in run.signals and run.signals["progress"] < 1.0


@pytest.mark.parametrize("state", ["directory", "fifo", "list", "link out"])
def test_a_state_file_that_is_not_a_json_object_fails_the_grade(
    suite: Path, grader: ModuleType, tmp_path: Path, state: str
) -> None:
    task_id = "claw-train-triage-000"
    workdir = tmp_path / "w"
    apply(suite, "train", task_id, load_solutions(suite, "train", task_id)["reference"], workdir)
    (workdir / STATE_FILE).unlink()
    if state == "directory":
        (workdir / STATE_FILE).mkdir()
    elif state == "fifo":
        os.mkfifo(workdir / STATE_FILE)
    elif state == "link out":
        (tmp_path / "elsewhere.json").write_text(json.dumps(load_solutions(suite, "train", task_id)))
        (workdir / STATE_FILE).symlink_to(tmp_path / "elsewhere.json")
    else:
        (workdir / STATE_FILE).write_text("[]")
    success, signals, _ = grader.grade(workdir, suite / "train" / task_id / "hidden")
    assert (success, signals["state_readable"]) == (False, 0.0)


def test_without_its_output_directory_the_grader_fails_naming_it(suite: Path, tmp_path: Path) -> None:
    task_dir = suite / "train" / "claw-train-triage-000"
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-I", str(task_dir / "hidden" / "grade.py")],
        cwd=task_dir / "workspace", env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "ORCHARD_GRADER_OUT is not set" in done.stderr


def test_a_forbidden_side_effect_fails_an_otherwise_correct_episode(
    suite: Path, grader: ModuleType, tmp_path: Path
) -> None:
    task_id = "claw-train-schedule-000"
    reference = load_solutions(suite, "train", task_id)["reference"]
    seed = json.loads((suite / "train" / task_id / "workspace" / ".claw" / "seed.json").read_text())
    other = seed["events"][0]["id"]
    apply(suite, "train", task_id, [*reference, {"name": "calendar_delete_event", "arguments": {"event_id": other}}],
          tmp_path / "w")  # fmt: skip
    success, signals, effects = grader.grade(tmp_path / "w", suite / "train" / task_id / "hidden")
    assert not success and effects == [f"events: {other} was deleted"]
    assert (signals["no_conflict"], signals["no_side_effects"], signals["progress"]) == (1.0, 0.0, 0.5)


def test_expert_plans_replay_the_solutions_then_submit(suite: Path, tmp_path: Path) -> None:
    reference = load_solutions(suite, "train", "claw-train-reply-000")["reference"]
    plan = solution_plan(reference)
    assert [step.tool_calls[0].name for step in plan.steps] == [c["name"] for c in reference] + ["submit"]
    assert all(len(step.tool_calls) == 1 for step in plan.steps)
    assert plan.steps[0].tool_calls[0].arguments == reference[0]["arguments"]

    summaries = write_demonstrations(suite, tmp_path / "demos", "train", wrong_fraction=0.5, seed=1)
    assert (
        len(summaries) == len(list((suite / "train").iterdir())) == len(list((tmp_path / "demos" / "plans").iterdir()))
    )
    kinds = {s["solution"] for s in summaries}
    assert kinds == {"reference", "wrong"}
    assert all(s["solution"] == choose(s["episode_id"], 0.5, 1) for s in summaries)
