"""Tasks and graders: what an episode works on, and how its end state becomes reward, success and signals.

A task directory holds ``task.yaml`` (id, instruction, grading command, limits), ``workspace/`` (copied into the
sandbox for the harness, without version-control history) and optionally ``hidden/`` (the grader and what it needs:
tests, references). The grader never lives in the working copy: once the harness has exited and every process it
started is dead, the runtime places ``hidden/`` in a fresh directory out of the agent's reach, named to the grading
command by ``$ORCHARD_GRADER_DIR`` (``Sandbox.run_grader``), and runs the command in the working copy, which is its
input only. The command's exit status decides success; it may also write ``$ORCHARD_GRADER_OUT/signals.json`` (a
JSON object of named numbers, such as the fraction of tests passing) for partial credit. Write grading commands as
``python3 -I "$ORCHARD_GRADER_DIR/grade.py"``: ``-I`` keeps the working copy, ``$HOME`` and ``PYTHON*`` variables
off the grader's import path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from orchard.exceptions import ConfigError, OrchardError
from orchard.sandbox import Limits, Sandbox

SIGNALS_FILE = "signals.json"
"""The grader's partial-credit signals, in ``$ORCHARD_GRADER_OUT``."""
MAX_HIDDEN_BYTES = 512 * 1024 * 1024


class TaskSpec(BaseModel):
    """One task, as ``task.yaml`` describes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    instruction: str = Field(min_length=1)
    grade_command: str = Field(min_length=1, description="Run in the working copy after the harness exits.")
    grade_timeout_s: float = Field(300.0, gt=0)
    harness_timeout_s: float = Field(1800.0, gt=0)
    max_steps: int = Field(30, ge=1)
    limits: Limits = Field(default_factory=Limits)
    git_snapshot: bool = Field(
        False,
        description="Give the working copy a fresh one-commit git repository of the workspace (for `git diff`; "
        "no history of the task's own making ever reaches the sandbox).",
    )
    image: str | None = Field(
        None, min_length=1, description="Container image of the episode on the Kubernetes runtime (per instance)."
    )
    labels: dict[str, Annotated[str, BeforeValidator(str)]] = Field(
        default_factory=dict,
        description="Facts about the task (repo, bug kind, split); `orchard eval` breaks results down by them.",
    )
    directory: Path = Field(description="The task directory (set by the loader).")

    @property
    def workspace(self) -> Path:
        """Files the harness starts from."""
        return self.directory / "workspace"

    @property
    def hidden(self) -> Path:
        """Files only the grader sees."""
        return self.directory / "hidden"


def load_task(directory: Path) -> TaskSpec:
    """Load ``directory/task.yaml``; a bad file fails with the field named."""
    path = directory / "task.yaml"
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read task {path}: {exc}") from exc
    try:
        task = TaskSpec(**data, directory=directory)
    except (TypeError, ValidationError) as exc:
        raise ConfigError(f"invalid task {path}: {exc}") from exc
    if not task.workspace.is_dir():
        raise ConfigError(f"task {task.task_id}: {task.workspace} is missing")
    return task


class TaskCatalog:
    """Tasks by id, from a directory of task directories."""

    def __init__(self, root: Path) -> None:
        self.tasks = {task.task_id: task for task in (load_task(d) for d in sorted(root.iterdir()) if d.is_dir())}

    def get(self, task_id: str) -> TaskSpec:
        """The task ``task_id``; ``OrchardError`` naming the known ones if absent."""
        try:
            return self.tasks[task_id]
        except KeyError:
            raise OrchardError(f"unknown task {task_id!r}; known: {sorted(self.tasks)[:20]}") from None


class Grade(BaseModel):
    """What a grader concluded."""

    reward: float
    success: bool
    signals: dict[str, float] = Field(default_factory=dict)
    log: str = ""


def grade(sandbox: Sandbox, task: TaskSpec) -> Grade:
    """Run the task's grader over the sandbox's working copy (``Sandbox.run_grader``): its verdict and signals."""
    run = sandbox.run_grader(grader_files(task), task.grade_command, timeout_s=task.grade_timeout_s)
    result = run.result
    signals = read_signals(run.outputs.get(SIGNALS_FILE))
    success = result.exit_code == 0 and not result.timed_out
    signals.setdefault("grade_timed_out", float(result.timed_out))
    return Grade(
        reward=1.0 if success else 0.0, success=success, signals=signals, log=(result.stdout + result.stderr)[-4000:]
    )


def grader_files(task: TaskSpec) -> dict[str, bytes]:
    """Every file of the task's ``hidden/`` by relative path (symbolic links are not followed out of it)."""
    if not task.hidden.is_dir():
        return {}
    files, total = {}, 0
    for path in sorted(task.hidden.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        if total > MAX_HIDDEN_BYTES:
            raise OrchardError(f"task {task.task_id}: hidden/ holds more than {MAX_HIDDEN_BYTES} bytes")
        files[path.relative_to(task.hidden).as_posix()] = data
    return files


def read_signals(data: bytes | None) -> dict[str, float]:
    """A signals file's named numbers; anything malformed counts as no signals.

    >>> read_signals(b'{"f2p_fraction": 0.5}'), read_signals(b"[1]"), read_signals(None)
    ({'f2p_fraction': 0.5}, {}, {})
    """
    if not data:
        return {}
    try:
        raw = json.loads(data)
        return {str(k): float(v) for k, v in raw.items()}
    except (ValueError, AttributeError, TypeError):
        return {}
