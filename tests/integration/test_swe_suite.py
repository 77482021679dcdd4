"""Every instance of the shipped SWE suite (recipes/swe/suite/) is sound as a task: built, the agent's side holds
neither the fix nor the hidden tests' names, the unchanged repository fails every FAIL_TO_PASS test and passes every
PASS_TO_PASS test, and the reference fix resolves it, as the shipped grader decides (one pytest run per state)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchard.env.tasks import load_task
from recipes.swe.build import SUITE_DIR, BuildConfig, write_task
from recipes.swe.instance import load_suite, snapshot, suite_instances
from tests.unit.recipes.grader_run import run_grader

INSTANCES = suite_instances(SUITE_DIR)


def graded(task: Path, work: Path, overlay: Path | None) -> tuple[int, dict[str, float], str]:
    """The end of an episode: the workspace copied without .git (as the runtime does), ``overlay``'s files written
    over it, the grade command run with the grader outside the working copy (as the Env runs it); returns its exit
    status, signals and stderr."""
    shutil.copytree(task / "workspace", work, ignore=shutil.ignore_patterns(".git"))
    if overlay is not None:
        shutil.copytree(overlay, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    run = run_grader(task, work, work.with_name(f"{work.name}-grader"))
    assert run.signals is not None, run.stderr
    return run.exit_code, run.signals, run.stderr[-3000:]


def test_suite_instance_ids_are_unique_and_every_instance_loads() -> None:
    instances = load_suite(SUITE_DIR)
    assert len({i.instance_id for i in instances}) == len(instances) == len(INSTANCES)


@pytest.mark.parametrize("instance_dir", INSTANCES, ids=[d.name for d in INSTANCES])
def test_the_instance_builds_hides_its_solution_fails_unchanged_and_is_resolved_by_its_fix(
    instance_dir: Path, tmp_path: Path
) -> None:
    task_dir = tmp_path / "task"
    instance = write_task(instance_dir, task_dir, BuildConfig())
    task = load_task(task_dir)
    assert task.task_id == instance.instance_id

    # nothing the agent can read names a hidden test or holds a fixed file
    visible = {p: d for p, d in snapshot(task_dir).items() if not p.startswith(("hidden/", "workspace/.git/"))}
    text = "\n".join(d.decode("utf-8", errors="replace") for d in visible.values())
    for test_id in instance.FAIL_TO_PASS:
        name = test_id.split("::")[-1].split("[")[0]
        assert name not in text, f"{name} is visible to the agent"
    for path in instance.patched_files("test_patch"):
        assert path not in text and f"workspace/{path}" not in visible
    base = snapshot(instance_dir / "repo")
    fixed = {data for path, data in snapshot(instance_dir / "fix").items() if base.get(path) != data}
    assert not fixed & set(snapshot(task_dir).values()), "a fixed file is in the task directory"

    code, signals, log = graded(task_dir, tmp_path / "unchanged", None)
    assert code == 1, log
    assert (signals["f2p_fraction"], signals["p2p_fraction"], signals["test_patch_applied"]) == (0.0, 1.0, 1.0), log

    code, signals, log = graded(task_dir, tmp_path / "fixed", instance_dir / "fix")
    assert code == 0, log
    assert (signals["resolved"], signals["touched_reference_files"]) == (1.0, 1.0), log
