"""The tasks of an evaluation split: every task directory's ``task.yaml`` (id and labels), in directory order."""

from __future__ import annotations

from pathlib import Path

from orchard.env.tasks import TaskSpec, load_task
from orchard.evaluation.exceptions import EvaluationError


def tasks_in(directory: Path) -> list[TaskSpec]:
    """The tasks under ``directory`` (each sub-directory holding a ``task.yaml``), sorted by directory name."""
    if not directory.is_dir():
        raise EvaluationError(f"task directory {directory} does not exist")
    task_dirs = sorted(d for d in directory.iterdir() if d.is_dir() and (d / "task.yaml").is_file())
    if not task_dirs:
        raise EvaluationError(f"no task directories (with a task.yaml) under {directory}")
    return [load_task(d) for d in task_dirs]


def task_ids_in(directory: Path) -> list[str]:
    """The ids of the tasks under ``directory``."""
    return [task.task_id for task in tasks_in(directory)]
