"""The file-lookup recipe's data side: deterministic, disjoint splits of valid tasks; the grader's documented rewards
and signals on hand-made working copies; the expert's plans for each kind of demonstration."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchard.engines.scripted import ScriptedPlan
from orchard.env.tasks import TaskCatalog
from recipes.file_lookup.expert import DemoKind, Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import (
    GRADE_SCRIPT,
    LookupConfig,
    LookupTask,
    generate,
    generate_tasks,
    write_task,
)
from recipes.file_lookup.grade import format_reference, parse_reference, signals_json
from tests.unit.recipes.grader_run import (
    FORGED_SIGNALS,
    plant_forged_results,
    plant_shadow_modules,
    run_grader,
    shadow_imports,
)

SMALL = LookupConfig(seed=3, train_tasks=40, eval_tasks=200)
TASK = LookupTask(
    "t-1", {"owl.txt": {"x": "233", "y": "417"}, "dog.txt": {"x": "150", "y": "902"}}, file="owl.txt", key="y"
)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_same_config_writes_byte_identical_trees_and_another_seed_does_not(tmp_path: Path) -> None:
    generate(SMALL, tmp_path / "a")
    generate(SMALL, tmp_path / "b")
    generate(SMALL.model_copy(update={"seed": 4}), tmp_path / "c")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    assert tree(tmp_path / "a") != tree(tmp_path / "c")


def test_splits_are_disjoint_and_the_eval_split_does_not_depend_on_the_train_size() -> None:
    splits = generate_tasks(SMALL)
    assert (len(splits["train"]), len(splits["eval"])) == (40, 200)
    train = {task.fingerprint for task in splits["train"]}
    evaluation = {task.fingerprint for task in splits["eval"]}
    assert (len(train), len(evaluation), train & evaluation) == (40, 200, set())
    bigger = generate_tasks(SMALL.model_copy(update={"train_tasks": 80}))
    assert bigger["eval"] == splits["eval"]


def test_every_task_is_a_valid_orchard_task_with_its_answer_only_in_hidden(tmp_path: Path) -> None:
    splits = generate(SMALL, tmp_path)
    catalog = TaskCatalog(tmp_path / "eval")
    assert sorted(catalog.tasks) == [task.task_id for task in splits["eval"]]
    spec = catalog.get("file-lookup-eval-00000")
    task = LookupTask.from_directory(spec.directory)
    assert task == splits["eval"][0]
    assert (spec.instruction, spec.grade_command, spec.max_steps) == (
        task.instruction, 'python3 -I -S "$ORCHARD_GRADER_DIR/grade.py"', 6,
    )  # fmt: skip
    assert sorted(p.name for p in spec.workspace.iterdir()) == sorted(task.files)
    assert (spec.workspace / task.file).read_text() == task.file_text(task.file)
    assert sorted(tree(spec.hidden)) == ["grade.py", "reference.txt"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["splits"]["train"] == [task.task_id for task in splits["train"]]


def test_generation_refuses_a_non_empty_output_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        generate(SMALL, tmp_path)


def test_values_stay_in_the_configured_range_and_the_default_range_keeps_the_old_tasks() -> None:
    narrow = generate_tasks(SMALL.model_copy(update={"value_min": 500}))
    values = [int(v) for split in narrow.values() for task in split for f in task.files.values() for v in f.values()]
    assert min(values) >= 500 and max(values) <= 999
    # the default (100-999) draws exactly what the generator drew before the option existed
    assert generate_tasks(SMALL)["eval"][0].files == {
        "cow.txt": {"y": "957", "z": "574"}, "bee.txt": {"x": "469", "z": "622"}, "emu.txt": {"w": "468", "x": "437"}
    }  # fmt: skip


def test_the_default_config_draws_writes_and_fingerprints_its_first_eval_task_as_before_two_hop_tasks(
    tmp_path: Path,
) -> None:
    # pinned from the generator before ``hops`` existed: one-hop tasks (and the grader's reference) must not move
    task = generate_tasks(LookupConfig(train_tasks=1, eval_tasks=1))["eval"][0]
    files = {
        "owl.txt": {"y": "246", "z": "225"},
        "hen.txt": {"x": "295", "z": "885"},
        "cow.txt": {"x": "622", "z": "406"},
    }
    assert task == LookupTask("file-lookup-eval-00000", files, file="hen.txt", key="x", hops=1)
    assert (task.instruction, task.fingerprint) == (
        "Write the value of x in hen.txt to answer.txt.",
        "b3288fe209b6b532",
    )
    write_task(task, LookupConfig(), tmp_path / "task")
    assert tree(tmp_path / "task" / "workspace") == {
        "cow.txt": b"x: 622\nz: 406\n", "hen.txt": b"x: 295\nz: 885\n", "owl.txt": b"y: 246\nz: 225\n"
    }  # fmt: skip
    assert (tmp_path / "task" / "hidden" / "reference.txt").read_text() == (
        "file hen.txt\nkey x\nanswer 295\nvalue cow.txt x 622\nvalue cow.txt z 406\nvalue hen.txt x 295\n"
        "value hen.txt z 885\nvalue owl.txt y 246\nvalue owl.txt z 225\n"
    )


@pytest.mark.parametrize(
    ("update", "field"),
    [({"value_min": 99}, "value_min"), ({"value_max": 1000}, "value_max"), ({"value_min": 600, "value_max": 500},
     "value_min"), ({"value_min": 998, "keys_per_file": 2}, "too large")],
)  # fmt: skip
def test_a_value_range_that_is_not_three_digits_or_too_narrow_is_refused_naming_it(
    update: dict[str, int], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        LookupConfig(**(SMALL.model_dump() | update))


def working_copy(tmp_path: Path, answer: str | None) -> tuple[Path, Path]:
    """``TASK``'s directory and a working copy of it as the harness left it (workspace and answer)."""
    task_dir = tmp_path / "task"
    write_task(TASK, SMALL, task_dir)
    work = tmp_path / "work"
    shutil.copytree(task_dir / "workspace", work)
    if answer is not None:
        (work / "answer.txt").write_text(answer)
    return task_dir, work


def grade_copy(tmp_path: Path, answer: str | None) -> tuple[int, dict[str, float] | None]:
    """Run ``TASK``'s grade command over a working copy holding ``answer``, as the Env does (the grader outside the
    working copy); returns its exit status and signals."""
    task_dir, work = working_copy(tmp_path, answer)
    run = run_grader(task_dir, work, tmp_path / "grader", timeout_s=30)
    return run.exit_code, run.signals


def signals(written: float, fmt: float, right_file: float, correct: float, progress: float) -> dict[str, float]:
    """The grader's signals, in the order the docs list them."""
    return {
        "answer_written": written, "answer_format": fmt, "right_file": right_file, "answer_correct": correct,
        "progress": progress,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "status", "expected"),
    [
        ("417\n", 0, signals(1, 1, 1, 1, 1.0)),  # correct
        ("233\n", 1, signals(1, 1, 1, 0, 0.5)),  # right file, wrong key
        ("y=417\n", 1, signals(1, 0, 1, 0, 0.3)),  # right value, wrong format
        ("902\n", 1, signals(1, 1, 0, 0, 0.2)),  # right key of the wrong file
        ("555", 1, signals(1, 1, 0, 0, 0.2)),  # a well-formed guess
        ("the answer", 1, signals(1, 0, 0, 0, 0.0)),
        ("", 1, signals(0, 0, 0, 0, 0.0)),
        (None, 1, signals(0, 0, 0, 0, 0.0)),  # no answer file
    ],
)
def test_the_grader_exits_zero_only_for_the_right_answer_and_writes_the_documented_signals(
    tmp_path: Path, answer: str | None, status: int, expected: dict[str, float]
) -> None:
    assert grade_copy(tmp_path, answer) == (status, expected)


def test_planted_modules_and_forged_signals_in_the_working_copy_change_nothing(tmp_path: Path) -> None:
    task_dir, work = working_copy(tmp_path, "233\n")  # right file, wrong key
    plant_shadow_modules(work)
    plant_forged_results(work)
    (work / "reference.json").write_text(json.dumps({**TASK.reference(), "answer": "233"}))
    (work / "reference.txt").write_text(format_reference({**TASK.reference(), "answer": "233"}))
    run = run_grader(task_dir, work, tmp_path / "grader", timeout_s=30)
    assert shadow_imports(work) == []
    assert (run.exit_code, run.signals) == (1, signals(1, 1, 1, 0, 0.5)), run.stderr
    assert json.loads((work / ".orchard-signals.json").read_text()) == FORGED_SIGNALS  # read by nobody


def test_an_answer_linked_to_the_graders_own_reference_earns_nothing(tmp_path: Path) -> None:
    task_dir, work = working_copy(tmp_path, None)
    (work / "answer.txt").symlink_to(tmp_path / "grader" / "grader" / "reference.txt")  # where run_grader puts it
    run = run_grader(task_dir, work, tmp_path / "grader", timeout_s=30)
    assert (tmp_path / "grader" / "grader" / "reference.txt").is_file()
    assert (run.exit_code, run.signals) == (1, signals(0, 0, 0, 0, 0.0)), run.stderr


def test_without_its_output_directory_the_grader_fails_naming_it(tmp_path: Path) -> None:
    task_dir, work = working_copy(tmp_path, "417\n")
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-I", str(task_dir / "hidden" / "grade.py")],
        cwd=work, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "ORCHARD_GRADER_OUT is not set" in done.stderr


EXPECTED_PLANS = {
    DemoKind.PERFECT: [("shell", "cat owl.txt"), ("shell", "echo 417 > answer.txt"), ("submit", None)],
    DemoKind.WRONG_FILE_FIRST: [
        ("shell", "cat dog.txt"),
        ("shell", "cat owl.txt"),
        ("shell", "echo 417 > answer.txt"),
        ("submit", None),
    ],
    DemoKind.WRONG_KEY: [("shell", "cat owl.txt"), ("shell", "echo 233 > answer.txt"), ("submit", None)],
    DemoKind.WRONG_FILE: [("shell", "cat dog.txt"), ("shell", "echo 902 > answer.txt"), ("submit", None)],
    DemoKind.NO_ANSWER: [("shell", "cat owl.txt"), ("submit", None)],
}


@pytest.mark.parametrize("kind", list(EXPECTED_PLANS))
def test_each_kind_of_demonstration_is_the_documented_plan_of_tool_calls(kind: DemoKind) -> None:
    demo = Expert().demonstrate(TASK, "ep-1", kind)
    calls = [(s.tool_calls[0].name, s.tool_calls[0].arguments.get("command")) for s in demo.plan.steps]  # type: ignore[union-attr]
    assert (demo.kind, calls) == (kind, EXPECTED_PLANS[kind])


def test_a_no_read_demonstration_writes_a_guess_that_is_no_workspace_value() -> None:
    demo = Expert().demonstrate(TASK, "ep-1", DemoKind.NO_READ)
    assert demo.answer is not None and len(demo.answer) == 3
    assert demo.answer not in {"233", "417", "150", "902"}
    assert [s.tool_calls[0].name for s in demo.plan.steps] == ["shell", "submit"]


def test_kinds_follow_the_imperfect_fraction_deterministically_and_fall_back_when_infeasible() -> None:
    episodes = [f"ep-{i}" for i in range(2000)]
    expert = Expert(ExpertConfig(imperfect_fraction=0.3, seed=1))
    kinds = [expert.kind_for(e) for e in episodes]
    assert kinds == [Expert(ExpertConfig(imperfect_fraction=0.3, seed=1)).kind_for(e) for e in episodes]
    assert 0.25 < sum(k is not DemoKind.PERFECT for k in kinds) / len(kinds) < 0.35
    assert {expert.kind_for(e) for e in episodes[:50]} != {DemoKind.PERFECT}
    assert {Expert(ExpertConfig(imperfect_fraction=0.0)).kind_for(e) for e in episodes} == {DemoKind.PERFECT}
    lonely = LookupTask("t-2", {"owl.txt": {"y": "417"}}, file="owl.txt", key="y")
    assert Expert().demonstrate(lonely, "ep-1", DemoKind.WRONG_KEY).kind is DemoKind.NO_READ


def test_written_demonstrations_are_loadable_plans_with_a_summary_line_each(tmp_path: Path) -> None:
    generate(LookupConfig(train_tasks=5, eval_tasks=1), tmp_path / "tasks")
    demos = write_demonstrations(tmp_path / "tasks" / "train", tmp_path / "demos", Expert(), episodes_per_task=2)
    lines = [json.loads(line) for line in (tmp_path / "demos" / "demonstrations.jsonl").read_text().splitlines()]
    assert [line["episode_id"] for line in lines] == [d.episode_id for d in demos]
    assert len(demos) == 10
    for demo in demos:
        assert ScriptedPlan.from_file(tmp_path / "demos" / "plans" / f"{demo.episode_id}.yaml") == demo.plan


def test_the_recipe_records_valid_task_options_with_at_least_200_held_out_tasks_and_valid_expert_options() -> None:
    recipe = yaml.safe_load((Path(GRADE_SCRIPT).parent / "recipe.yaml").read_text())
    options = {k: v for k, v in recipe["tasks"].items() if k not in ("generator", "dir")}
    assert LookupConfig(**options).eval_tasks >= 200
    assert ExpertConfig(**{k: v for k, v in recipe["expert"].items() if k not in ("module", "episodes_per_task")})


def test_the_grader_imports_nothing_but_os_beyond_a_bare_interpreter_start(tmp_path: Path) -> None:
    # every episode pays for the grader's start: json (with re and enum) alone would double a bare start
    task_dir, work = working_copy(tmp_path, "417\n")
    (tmp_path / "out").mkdir()
    command = ["/usr/bin/python3", "-I", "-S", "-X", "importtime"]
    bare = subprocess.run([*command, "-c", "pass"], capture_output=True, text=True, check=True)  # noqa: S603
    graded = subprocess.run(  # noqa: S603
        [*command, str(task_dir / "hidden" / "grade.py")],
        cwd=work, env={"ORCHARD_GRADER_OUT": str(tmp_path / "out")}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert graded.returncode == 0, graded.stderr

    def modules(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}

    extra = modules(graded.stderr) - modules(bare.stderr)  # os and its frozen helpers: what site would load
    assert extra <= {"__future__", "os", "posixpath", "genericpath", "stat", "_stat", "_collections_abc", "abc"}


def test_the_graders_reference_and_signals_formats_read_back_exactly() -> None:
    reference = TASK.reference()
    assert parse_reference(format_reference(reference)) == reference
    sample = {"answer_written": 1.0, "right_file": 0.0, "progress": 0.3, "answer_format": 0.0, "answer_correct": 0.0}
    assert signals_json(sample) == json.dumps(sample, sort_keys=True) + "\n"
    with pytest.raises(ValueError, match="whitespace"):
        format_reference({**reference, "answer": "4 17"})
    with pytest.raises(SystemExit, match="no answer line"):
        parse_reference("file owl.txt\nkey y\n")
