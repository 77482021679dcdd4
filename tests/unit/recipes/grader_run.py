"""Run a task's grader the way the Env's contract does (issue 15), without a sandbox, for the recipes' grader tests.

The task's ``hidden/`` is copied into a read-only directory outside the working copy (``$ORCHARD_GRADER_DIR``), the
output directory is fresh (``$ORCHARD_GRADER_OUT``), and the task's own grade command runs through ``/bin/sh -c``
in the working copy with a clean environment: ``PATH``, a fresh ``HOME`` and ``TMPDIR``, ``LANG`` and the two
grader variables. ``python3`` on that ``PATH`` is this interpreter (whose environment has pytest, for SWE).

Also the planted-module check: ``plant_shadow_modules`` writes, into a working copy, a module named like every
standard-library module (and pytest's), each of which records its own import; ``shadow_imports`` lists those that
were imported (none may be).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

SIGNALS_NAME = "signals.json"
SHADOW_MARK = ".shadow-imported"
PYTEST_NAMES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging")
SHADOW = 'open(__file__ + "' + SHADOW_MARK + '", "w").close()\nraise SystemExit(0)\n'
"""A planted module's body: mark the import (``open`` is a builtin), then end the process with status 0."""


@dataclass(frozen=True)
class GraderRun:
    """What a grade command did: its exit status, the signals it wrote in its output directory, its stderr."""

    exit_code: int
    signals: dict[str, float] | None
    stderr: str


def python_bin(directory: Path) -> Path:
    """A directory whose ``python3`` runs this interpreter (a script, so the virtual environment is kept)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "python3"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    script.chmod(0o755)
    return directory


def read_only(root: Path) -> None:
    """Make every file and directory under ``root`` (and ``root``) read-only."""
    for path in [*root.rglob("*"), root]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def run_grader(
    task_dir: Path, work: Path, scratch: Path, *, path: str | None = None, timeout_s: float = 300.0
) -> GraderRun:
    """Run ``task_dir``'s grade command over the working copy ``work``; ``scratch`` holds the grader's directories
    (it must not be inside ``work``). ``path`` replaces the system ``PATH`` (``python3`` stays first on it)."""
    grader, out, home, tmp = (scratch / name for name in ("grader", "grader-out", "home", "tmp"))
    shutil.copytree(task_dir / "hidden", grader)
    read_only(grader)
    for directory in (out, home, tmp):
        directory.mkdir(parents=True)
    command = yaml.safe_load((task_dir / "task.yaml").read_text())["grade_command"]
    env = {
        "PATH": f"{python_bin(scratch / 'bin')}:{path if path is not None else os.environ['PATH']}",
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "LANG": "C.UTF-8",
        "ORCHARD_GRADER_DIR": str(grader),
        "ORCHARD_GRADER_OUT": str(out),
    }
    done = subprocess.run(  # noqa: S603
        ["/bin/sh", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    result = out / SIGNALS_NAME
    signals = json.loads(result.read_text()) if result.is_file() else None
    return GraderRun(done.returncode, signals, done.stderr[-4000:])


def plant_shadow_modules(directory: Path) -> None:
    """A module named like every standard-library module and pytest's, in ``directory``; each marks its import."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in sorted({*sys.stdlib_module_names, *PYTEST_NAMES}):
        (directory / f"{name}.py").write_text(SHADOW)


def shadow_imports(root: Path) -> list[str]:
    """The planted modules under ``root`` that were imported."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob(f"*{SHADOW_MARK}"))


FORGED_SIGNALS = {"progress": 1.0, "resolved": 1.0, "success": 1.0, "answer_correct": 1.0, "forged": 1.0}


def plant_forged_results(work: Path) -> None:
    """What an agent might leave to forge its reward: signals files where older graders wrote them, and an old-style
    ``.grader/`` with a grade script that reports success."""
    for name in (".orchard-signals.json", SIGNALS_NAME):
        (work / name).write_text(json.dumps(FORGED_SIGNALS))
    (work / ".grader").mkdir(exist_ok=True)
    (work / ".grader" / "grade.py").write_text(SHADOW)
    (work / ".grader" / SIGNALS_NAME).write_text(json.dumps(FORGED_SIGNALS))
