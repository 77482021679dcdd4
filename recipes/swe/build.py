"""Builds Orchard task directories from the local SWE suite: one per instance, the fix and hidden tests kept out.

Layout written under ``OUT``::

    OUT/manifest.json                   the config and each split's instance ids
    OUT/<split>/<instance_id>/task.yaml the problem statement as instruction, the grade command (``GRADE_COMMAND``)
                             /workspace/ the repository at base: ``repo/`` as a git repository with one commit
                             /hidden/grade.py, grade_runner.py, instance.json   the grader (run from outside
                                                                the working copy)

``instance.json`` holds what grading needs and nothing that solves the task: ``FAIL_TO_PASS``, ``PASS_TO_PASS``,
``test_patch``, the reference fix's file list (never the fix itself), the sha256 manifest of the base files, the test
directories the grader resets whole (``reset_directories``) and the base content of every file the grader resets
(those directories' files, the graded test files, ``conftest.py`` and pytest configuration files: all visible at
base; a file that is not UTF-8 as ``{"base64": ...}``). The same suite always writes the same files and the same
base commit id (fixed identity and dates).

Run: ``python -m recipes.swe.build SUITE_DIR OUT [--split train|eval|all] [--overwrite]``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from recipes.swe.grade import PYTEST_CONFIG_NAMES, STARTUP_NAMES
from recipes.swe.instance import SweInstance, load_suite_instance, snapshot, suite_instances

log = get_logger("recipes.swe")

GRADE_SCRIPT = Path(__file__).resolve().parent / "grade.py"
RUNNER_SCRIPT = Path(__file__).resolve().parent / "grade_runner.py"
"""The grader's pytest runner, shipped beside it."""
TEST_DIR_NAMES = frozenset({"tests", "test", "testing"})
GRADE_COMMAND = '{python} -I "$ORCHARD_GRADER_DIR/grade.py"'
"""The grade command, ``{python}`` the configured interpreter: ``-I`` keeps the working copy off its path."""
SUITE_DIR = Path(__file__).resolve().parent / "suite"
GIT_NAME = "orchard"
GIT_EMAIL = "orchard@localhost"
GIT_DATE = "2000-01-01T00:00:00Z"


class BuildError(OrchardError):
    """A task directory cannot be built (git missing or failing, output in the way)."""


class BuildConfig(BaseModel):
    """Limits written into every ``task.yaml``; every field is also a command-line option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Literal["train", "eval", "all"] = Field("all", description="Which split to build.")
    max_steps: int = Field(40, ge=1, description="Model calls the harness may make.")
    harness_timeout_s: float = Field(1200.0, gt=0, description="Wall-clock limit of the harness.")
    grade_timeout_s: float = Field(300.0, gt=10, description="Wall-clock limit of the grader (pytest gets 10 s less).")
    python: str = Field("python3", description="Interpreter of the grade command inside the sandbox.")
    git_snapshot: bool = Field(
        True, description="The runtime gives the working copy a one-commit git repository (`git diff` works)."
    )
    image_template: str | None = Field(
        None,
        min_length=1,
        description="Container image of an instance without its own `image` on the Kubernetes runtime; "
        "{instance_id} and {repo} are filled in (e.g. registry.local/orchard-swe:{instance_id}).",
    )


def node_file(test_id: str) -> str:
    """The file part of a pytest node id."""
    return test_id.split("::", 1)[0]


def is_under(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or inside it (POSIX relative paths)."""
    return path == directory or path.startswith(directory + "/")


def only_tests(directory: str, base: Mapping[str, bytes], reference: Sequence[str]) -> bool:
    """Whether ``directory`` holds no code to fix: none of the reference fix's files, and no Python file at base but
    test modules, ``conftest.py`` and empty ``__init__.py``."""
    if any(is_under(path, directory) for path in reference):
        return False
    for path, data in base.items():
        name = path.rsplit("/", 1)[-1]
        if is_under(path, directory) and name.endswith(".py") and not (name == "__init__.py" and not data.strip()):
            if not (name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py")):
                return False
    return True


def reset_directories(base: Mapping[str, bytes], test_files: Iterable[str], reference: Sequence[str]) -> list[str]:
    """The directories the grader resets whole: every base directory named ``tests``, ``test`` or ``testing`` (the
    outermost, as SWE-bench tells test files from the fix), and the directory of each graded or hidden-test file
    when it holds nothing but tests (``only_tests``); never the root, never one holding a file of the fix."""
    found = set()
    for path in base:
        parts = path.split("/")[:-1]
        named = next((i for i, part in enumerate(parts) if part in TEST_DIR_NAMES), None)
        if named is not None:
            found.add("/".join(parts[: named + 1]))
    found |= {d for d in {path.rpartition("/")[0] for path in test_files} if d and only_tests(d, base, reference)}
    found = {d for d in found if not any(is_under(path, d) for path in reference)}
    return sorted(d for d in found if not any(d != other and is_under(d, other) for other in found))


def stored(data: bytes) -> str | dict[str, str]:
    """A base file as ``instance.json`` holds it: its text, or ``{"base64": ...}`` when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def grader_instance(instance: SweInstance, base: Mapping[str, bytes], config: BuildConfig) -> dict[str, object]:
    """The grader's ``instance.json``: everything ``grade.py`` needs, nothing of the reference fix but its paths."""
    test_files = set(instance.patched_files("test_patch"))
    test_files |= {node_file(test_id) for test_id in instance.FAIL_TO_PASS + instance.PASS_TO_PASS}
    reference = instance.patched_files("patch")
    directories = reset_directories(base, test_files, reference)
    reset = test_files | {path for path in base if path.split("/")[-1] in PYTEST_CONFIG_NAMES | STARTUP_NAMES}
    reset |= {path for path in base if any(is_under(path, d) for d in directories)}
    return {
        "instance_id": instance.instance_id,
        "FAIL_TO_PASS": instance.FAIL_TO_PASS,
        "PASS_TO_PASS": instance.PASS_TO_PASS,
        "test_patch": instance.test_patch,
        "reference_files": reference,
        "base_files": {path: hashlib.sha256(data).hexdigest() for path, data in base.items()},
        "test_dirs": directories,
        "restore": {path: stored(base[path]) if path in base else None for path in sorted(reset)},
        "test_timeout_s": config.grade_timeout_s - 10,
    }


def git_commit_all(directory: Path) -> str:
    """Make ``directory`` a git repository whose single commit is its content; returns the commit id."""
    git = shutil.which("git")
    if git is None:
        raise BuildError("building SWE tasks needs git on PATH")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(directory),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_AUTHOR_DATE": GIT_DATE,
        "GIT_COMMITTER_DATE": GIT_DATE,
    }
    identity = ["-c", f"user.name={GIT_NAME}", "-c", f"user.email={GIT_EMAIL}", "-c", "commit.gpgsign=false"]
    steps = (
        ["init", "-q", "--template=", "--initial-branch=main"],
        ["add", "-A"],
        ["commit", "-q", "--no-verify", "-m", "base"],
        ["rev-parse", "HEAD"],
    )
    out = b""
    for step in steps:
        done = subprocess.run([git, *identity, *step], cwd=directory, env=env, capture_output=True, check=False)  # noqa: S603
        if done.returncode != 0:
            raise BuildError(f"git {step[0]} in {directory} failed: {done.stderr.decode(errors='replace').strip()}")
        out = done.stdout
    return out.decode().strip()


def task_yaml(instance: SweInstance, config: BuildConfig) -> str:
    """The task's ``task.yaml`` (fields of ``orchard.env.tasks.TaskSpec``)."""
    spec = {
        "task_id": instance.instance_id,
        "instruction": instance.problem_statement,
        "grade_command": GRADE_COMMAND.format(python=config.python),
        "grade_timeout_s": config.grade_timeout_s,
        "harness_timeout_s": config.harness_timeout_s,
        "max_steps": config.max_steps,
        "git_snapshot": config.git_snapshot,
        "labels": {"repo": instance.repo, "split": instance.split}
        | ({"bug_kind": instance.bug_kind} if instance.bug_kind else {}),
    }
    image = instance.image or (
        config.image_template.format(instance_id=instance.instance_id, repo=instance.repo.replace("/", "__"))
        if config.image_template
        else None
    )
    if image:
        spec["image"] = image
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)


def write_grader(directory: Path, record: Mapping[str, object]) -> None:
    """The task's ``hidden/``: ``grade.py``, its ``grade_runner.py`` and ``record`` as ``instance.json``, at its top
    (the Env places ``hidden/`` in ``$ORCHARD_GRADER_DIR``)."""
    hidden = directory / "hidden"
    hidden.mkdir(parents=True)
    shutil.copyfile(GRADE_SCRIPT, hidden / "grade.py")
    shutil.copyfile(RUNNER_SCRIPT, hidden / "grade_runner.py")
    (hidden / "instance.json").write_text(json.dumps(record, sort_keys=True, indent=1) + "\n", encoding="utf-8")


def write_task(instance_dir: Path, directory: Path, config: BuildConfig) -> SweInstance:
    """Write the task directory of the suite instance at ``instance_dir`` into ``directory``; returns the instance."""
    instance = load_suite_instance(instance_dir)
    base = snapshot(instance_dir / "repo")
    workspace = directory / "workspace"
    for path, data in base.items():
        (workspace / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / path).write_bytes(data)
    workspace.mkdir(parents=True, exist_ok=True)
    commit = git_commit_all(workspace)
    write_grader(directory, {**grader_instance(instance, base, config), "base_commit": commit})
    (directory / "task.yaml").write_text(task_yaml(instance, config), encoding="utf-8")
    return instance


def build(
    suite: Path, out: Path, config: BuildConfig | None = None, *, overwrite: bool = False
) -> dict[str, list[str]]:
    """Write a task directory for every instance of ``suite`` in ``config.split`` under ``out/<split>/``.

    Refuses a non-empty ``out`` unless ``overwrite``. Returns the instance ids by split (sorted).
    """
    config = config or BuildConfig()
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise BuildError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    splits: dict[str, list[str]] = {"train": [], "eval": []}
    staging = out / ".staging"
    for instance_dir in suite_instances(suite):
        # the split is in instance.yaml: build into staging, then move the directory under its split
        target = staging / instance_dir.name
        instance = write_task(instance_dir, target, config)
        if config.split not in ("all", instance.split):
            shutil.rmtree(target)
            continue
        (out / instance.split).mkdir(parents=True, exist_ok=True)
        target.rename(out / instance.split / instance.instance_id)
        splits[instance.split].append(instance.instance_id)
    if staging.exists():
        shutil.rmtree(staging)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"recipe": "swe", "suite": suite.name, "config": config.model_dump(), "splits": splits}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    log.info("swe tasks written", out=str(out), **{split: len(ids) for split, ids in splits.items()})
    return splits


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.swe.build SUITE_DIR OUT [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.swe.build", description=__doc__.split("\n")[0])
    parser.add_argument("suite", type=Path, help="The suite directory (recipes/swe/suite).")
    parser.add_argument("out", type=Path, help="Output directory (train/, eval/, manifest.json).")
    parser.add_argument("--split", choices=("train", "eval", "all"), default=None, help="Which split to build.")
    for name, field in BuildConfig.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        if name == "split":
            continue
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        else:
            kind = str if field.default is None else type(field.default)
            parser.add_argument(flag, type=kind, help=field.description)
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output directory.")
    args = parser.parse_args(argv)
    fields = {name: getattr(args, name) for name in BuildConfig.model_fields if getattr(args, name) is not None}
    build(args.suite, args.out, BuildConfig(**fields), overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
