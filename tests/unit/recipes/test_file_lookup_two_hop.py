"""The file-lookup recipe's two-hop variant: the instruction names ``index.txt``, whose one line names the file.

Its tasks are the one-hop tasks plus the index, its splits stay disjoint, its tasks read back from their directories,
the grader grades it as before (nothing written to or from ``index.txt`` earns anything), and every expert plan that
reads a file reads the index first, with the grade the kinds table documents."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from recipes.file_lookup.expert import DemoKind, Expert, ExpertConfig
from recipes.file_lookup.generate import (
    LookupConfig,
    LookupTask,
    config_record,
    generate,
    generate_tasks,
    main,
    write_task,
)
from recipes.file_lookup.grade import parse_reference
from recipes.file_lookup.setup import setup
from tests.unit.recipes.grader_run import run_grader

SMALL = LookupConfig(seed=3, train_tasks=40, eval_tasks=200)
TWO_HOP = SMALL.model_copy(update={"hops": 2})
TASK = LookupTask(
    "t-2", {"owl.txt": {"x": "233", "y": "417"}, "dog.txt": {"x": "150", "y": "902"}}, file="owl.txt", key="y", hops=2
)


def test_a_two_hop_task_is_its_one_hop_task_with_an_index_naming_the_file_and_an_instruction_naming_the_index() -> None:
    one, two = generate_tasks(SMALL), generate_tasks(TWO_HOP)
    for split in ("train", "eval"):
        assert [(t.task_id, t.files, t.file, t.key, 2) for t in one[split]] == [
            (t.task_id, t.files, t.file, t.key, t.hops) for t in two[split]
        ]
    task = two["eval"][0]
    assert task.instruction == f"Write the value of {task.key} in the file named in index.txt to answer.txt."
    assert task.file not in task.instruction
    assert task.workspace_names == sorted([*task.files, "index.txt"])
    assert task.file_text("index.txt") == f"file: {task.file}\n"


def test_two_hop_splits_are_disjoint_though_the_instruction_no_longer_names_the_file() -> None:
    splits = generate_tasks(TWO_HOP)
    train = {task.fingerprint for task in splits["train"]}
    evaluation = {task.fingerprint for task in splits["eval"]}
    assert (len(train), len(evaluation), train & evaluation) == (40, 200, set())
    other_target = LookupTask(TASK.task_id, TASK.files, file="dog.txt", key="y", hops=2)
    assert other_target.instruction == TASK.instruction and other_target.fingerprint != TASK.fingerprint


def test_a_two_hop_task_reads_back_from_its_directory_and_an_old_reference_reads_as_one_hop(tmp_path: Path) -> None:
    write_task(TASK, TWO_HOP, tmp_path / "two")
    assert (tmp_path / "two" / "workspace" / "index.txt").read_text() == "file: owl.txt\n"
    assert "hops 2\n" in (tmp_path / "two" / "hidden" / "reference.txt").read_text()
    assert LookupTask.from_directory(tmp_path / "two") == TASK
    one_hop = LookupTask(TASK.task_id, TASK.files, TASK.file, TASK.key)
    write_task(one_hop, SMALL, tmp_path / "one")
    old = "file owl.txt\nkey y\nanswer 417\nvalue dog.txt x 150\nvalue dog.txt y 902\nvalue owl.txt x 233\n"
    (tmp_path / "one" / "hidden" / "reference.txt").write_text(old + "value owl.txt y 417\n")  # before hops existed
    assert "hops" not in parse_reference(old)
    assert LookupTask.from_directory(tmp_path / "one") == one_hop


def test_the_hops_option_writes_two_hop_splits_and_the_manifest_records_hops_only_when_not_one(tmp_path: Path) -> None:
    assert main([str(tmp_path / "two"), "--hops", "2", "--train-tasks", "2", "--eval-tasks", "1"]) == 0
    assert (tmp_path / "two" / "eval" / "file-lookup-eval-00000" / "workspace" / "index.txt").is_file()
    assert json.loads((tmp_path / "two" / "manifest.json").read_text())["config"]["hops"] == 2
    generate(LookupConfig(train_tasks=2, eval_tasks=1), tmp_path / "one")
    recorded = json.loads((tmp_path / "one" / "manifest.json").read_text())["config"]
    # as before the fields added since were added
    assert recorded == LookupConfig(train_tasks=2, eval_tasks=1).model_dump(exclude={"hops", "value_min", "value_max"})
    with pytest.raises(ValueError, match="hops"):
        LookupConfig(hops=3)


def test_setup_keeps_tasks_whose_manifest_predates_hops_and_refuses_them_for_two_hops(tmp_path: Path) -> None:
    lookup = LookupConfig(train_tasks=2, eval_tasks=1)
    tasks, _ = setup(tmp_path, lookup, ExpertConfig())
    manifest = tasks / "manifest.json"
    recorded = json.loads(manifest.read_text())["config"]
    assert not {"hops", "value_min", "value_max"} & set(recorded) and recorded == config_record(lookup)
    before = manifest.stat().st_mtime_ns
    setup(tmp_path, lookup, ExpertConfig())
    assert manifest.stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="other options"):
        setup(tmp_path, lookup.model_copy(update={"hops": 2}), ExpertConfig())


def working_copy(tmp_path: Path) -> tuple[Path, Path]:
    """``TASK``'s directory and a fresh working copy of its workspace."""
    task_dir = write_task(TASK, TWO_HOP, tmp_path / "task")
    work = tmp_path / "work"
    shutil.copytree(task_dir / "workspace", work)
    return task_dir, work


def grade(tmp_path: Path, work: Path, task_dir: Path) -> tuple[int, float | None]:
    """The grader's exit status and ``progress`` over ``work``."""
    run = run_grader(task_dir, work, tmp_path / "grader", timeout_s=30)
    return run.exit_code, None if run.signals is None else run.signals["progress"]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("417\n", (0, 1.0)),  # the named file's value
        ("233\n", (1, 0.5)),  # the named file, the other key
        ("902\n", (1, 0.2)),  # the key's value in the file the index does not name
        ("file: owl.txt\n", (1, 0.0)),  # the index's content
        ("owl.txt\n", (1, 0.0)),  # the file's name
        ("index.txt\n", (1, 0.0)),
    ],
)
def test_the_two_hop_grader_pays_only_for_the_named_files_value_and_nothing_for_the_index(
    tmp_path: Path, answer: str, expected: tuple[int, float]
) -> None:
    task_dir, work = working_copy(tmp_path)
    (work / "answer.txt").write_text(answer)
    assert grade(tmp_path, work, task_dir) == expected


def test_rewriting_the_index_does_not_move_the_target_and_an_answer_linked_to_it_earns_nothing(tmp_path: Path) -> None:
    task_dir, work = working_copy(tmp_path)
    (work / "index.txt").write_text("file: dog.txt\n")
    (work / "answer.txt").write_text("902\n")  # what the rewritten index leads to
    assert grade(tmp_path, work, task_dir) == (1, 0.2)
    shutil.rmtree(tmp_path / "grader")
    (work / "answer.txt").unlink()
    (work / "answer.txt").symlink_to(work / "index.txt")
    assert grade(tmp_path, work, task_dir) == (1, 0.0)


EXPECTED_PLANS = {
    DemoKind.PERFECT: ["cat index.txt", "cat owl.txt", "echo 417 > answer.txt", None],
    DemoKind.WRONG_FILE_FIRST: ["cat index.txt", "cat dog.txt", "cat owl.txt", "echo 417 > answer.txt", None],
    DemoKind.WRONG_KEY: ["cat index.txt", "cat owl.txt", "echo 233 > answer.txt", None],
    DemoKind.WRONG_FILE: ["cat index.txt", "cat dog.txt", "echo 902 > answer.txt", None],
    DemoKind.NO_ANSWER: ["cat index.txt", "cat owl.txt", None],
}
GRADES = {  # the kinds table: (exit status, progress)
    DemoKind.PERFECT: (0, 1.0),
    DemoKind.WRONG_FILE_FIRST: (0, 1.0),
    DemoKind.WRONG_KEY: (1, 0.5),
    DemoKind.WRONG_FILE: (1, 0.2),
    DemoKind.NO_READ: (1, 0.2),
    DemoKind.NO_ANSWER: (1, 0.0),
}


def commands(task: LookupTask, kind: DemoKind) -> list[str | None]:
    """The plan's shell commands in order (``None`` for ``submit``)."""
    steps = Expert().demonstrate(task, "ep-1", kind).plan.steps
    return [step.tool_calls[0].arguments.get("command") for step in steps]  # type: ignore[index]


@pytest.mark.parametrize("kind", list(EXPECTED_PLANS))
def test_each_two_hop_plan_reads_the_index_first_then_is_the_one_hop_plan(kind: DemoKind) -> None:
    one_hop = LookupTask(TASK.task_id, TASK.files, TASK.file, TASK.key)
    assert commands(TASK, kind) == EXPECTED_PLANS[kind] == ["cat index.txt", *commands(one_hop, kind)]


def test_a_two_hop_no_read_plan_reads_nothing_and_guesses_as_the_one_hop_plan_does() -> None:
    one_hop = LookupTask(TASK.task_id, TASK.files, TASK.file, TASK.key)
    two, one = (Expert().demonstrate(task, "ep-1", DemoKind.NO_READ) for task in (TASK, one_hop))
    assert commands(TASK, DemoKind.NO_READ) == [f"echo {two.answer} > answer.txt", None]
    assert two.answer == one.answer


@pytest.mark.parametrize("kind", list(GRADES))
def test_each_two_hop_plan_run_in_a_working_copy_gets_its_documented_grade(tmp_path: Path, kind: DemoKind) -> None:
    task_dir, work = working_copy(tmp_path)
    for command in commands(TASK, kind):
        if command is not None:
            subprocess.run(["/bin/sh", "-c", command], cwd=work, check=True, capture_output=True)  # noqa: S603
    assert grade(tmp_path, work, task_dir) == GRADES[kind]
