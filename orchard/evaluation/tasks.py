"""The task ids of an evaluation split: every task directory's ``task.yaml`` ``task_id``, in directory order."""

from __future__ import annotations

from pathlib import Path

from orchard.env.tasks import load_task
from orchard.evaluation.exceptions import EvaluationError


def task_ids_in(directory: Path) -> list[str]:
    """The ids of the tasks under ``directory`` (each sub-directory holding a ``task.yaml``)."""
    if not directory.is_dir():
        raise EvaluationError(f"task directory {directory} does not exist")
    task_dirs = sorted(d for d in directory.iterdir() if d.is_dir() and (d / "task.yaml").is_file())
    if not task_dirs:
        raise EvaluationError(f"no task directories (with a task.yaml) under {directory}")
    return [load_task(d).task_id for d in task_dirs]
