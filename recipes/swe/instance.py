"""Orchard's SWE task record and its loaders: SWE-bench / SWE-Gym instance files, and the local suite layout.

A ``SweInstance`` is one repository-with-a-bug: where the repository is (``repo``, ``base_commit``), the issue
(``problem_statement``), the tests that must go from failing to passing (``FAIL_TO_PASS``) and those that must keep
passing (``PASS_TO_PASS``), the hidden ``test_patch`` the grader applies after the agent is gone, and the reference
``patch``. Field names are those of the ``swebench`` package, so its instance files load as they are
(``load_swebench``); nothing is downloaded.

The local suite (``recipes/swe/suite/<instance_id>/``: ``instance.yaml``, ``repo/``, ``fix/``, ``hidden_tests/``) is
read by ``load_suite_instance``, which computes ``patch`` and ``test_patch`` as unified diffs (``unified_diff``).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.exceptions import ConfigError

Split = Literal["train", "eval"]
BugKind = Literal["logic", "off_by_one", "api_misuse", "edge_case", "multi_file"]
INSTANCE_ID_PATTERN = r"^[A-Za-z0-9._-]+$"
SUITE_ID_PATTERN = r"^[a-z0-9_-]+$"
SUITE_FILE = "instance.yaml"
SUITE_DIRS = ("repo", "fix", "hidden_tests")
SKIPPED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache"})
"""Never part of a snapshot or a diff: version control and caches a test run leaves behind."""


class InstanceError(ConfigError):
    """An instance file or suite directory is invalid; the message names the row or directory and the field."""


class SweInstance(BaseModel):
    """One SWE task: a repository at a base commit, an issue, and the tests that decide whether it is fixed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN, description="Unique id, e.g. 'astropy__astropy-12907'.")
    repo: str = Field(min_length=1, description="'owner/name' for SWE-bench rows; the package's name in the suite.")
    base_commit: str | None = Field(None, description="Commit the task starts from; None for the local suite.")
    problem_statement: str = Field(min_length=1, description="The issue text: the agent's instruction.")
    FAIL_TO_PASS: list[str] = Field(min_length=1, description="Test ids failing at base that the fix makes pass.")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="Test ids passing before and after the fix.")
    test_patch: str = Field(min_length=1, description="Unified diff adding the hidden tests (applied by the grader).")
    patch: str = Field("", description="The reference fix as a unified diff (never shown to the agent).")
    environment_setup: list[str] = Field(default_factory=list, description="Shell commands preparing the sandbox.")
    split: Split = Field("eval", description="'train' or the held-out 'eval'.")
    bug_kind: BugKind | None = Field(None, description="What kind of bug (the local suite says; SWE-bench does not).")
    image: str | None = Field(None, description="Per-instance container image for the Kubernetes runtime.")

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_ids(cls, value: Any) -> Any:
        # swebench stores both lists as JSON-encoded strings in its datasets
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a list of test ids nor a JSON-encoded one: {exc}") from exc
        return value

    @field_validator("environment_setup", mode="before")
    @classmethod
    def _setup_commands(cls, value: Any) -> Any:
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS")
    @classmethod
    def _non_empty_ids(cls, value: list[str]) -> list[str]:
        if any(not test_id.strip() for test_id in value):
            raise ValueError("a test id is empty")
        return value

    def patched_files(self, which: Literal["patch", "test_patch"] = "patch") -> list[str]:
        """The paths a diff of this instance changes (``b/`` side), in order."""
        return diff_paths(getattr(self, which))


RECORD_FIELDS = frozenset(SweInstance.model_fields)


def diff_paths(diff: str) -> list[str]:
    """Paths a unified diff changes, from its ``+++ b/...`` lines (the ``---`` side for deletions)."""
    paths: list[str] = []
    old = ""
    for line in diff.splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0]
        elif line.startswith("+++ "):
            new = line[4:].split("\t")[0]
            target = old if new == "/dev/null" else new
            path = target[2:] if target.startswith(("a/", "b/")) else target
            if path not in paths:
                paths.append(path)
    return paths


def _row_error(source: str, row: int | None, data: Any, exc: ValidationError) -> InstanceError:
    ident = data.get("instance_id") if isinstance(data, Mapping) else None
    problems = "; ".join(
        f"field {'.'.join(str(p) for p in error['loc']) or '(row)'}: {error['msg']}" for error in exc.errors()
    )
    where = f"row {row}" if row is not None else "instance"
    return InstanceError(f"{source}: {where}{f' ({ident})' if ident else ''}: {problems}")


def instance_from_row(data: Any, *, source: str, row: int, split: Split = "eval") -> SweInstance:
    """One SWE-bench row as a ``SweInstance``: unknown fields (``version``, ``hints_text``, ...) are ignored."""
    if not isinstance(data, Mapping):
        raise InstanceError(f"{source}: row {row}: expected a JSON object, got {type(data).__name__}")
    fields = {key: value for key, value in data.items() if key in RECORD_FIELDS}
    fields.setdefault("split", split)
    try:
        return SweInstance(**fields)
    except ValidationError as exc:
        raise _row_error(source, row, data, exc) from None


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl" or (path.suffix != ".json" and not text.lstrip().startswith("[")):
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InstanceError(f"{path}: row {number}: invalid JSON: {exc}") from None
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstanceError(f"{path}: invalid JSON: {exc}") from None
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, list):
        raise InstanceError(f"{path}: expected a JSON list of instances, got {type(data).__name__}")
    yield from enumerate(data, start=1)


def load_swebench(path: Path, *, split: Split = "eval") -> list[SweInstance]:
    """Instances from a local SWE-bench / SWE-Gym file: a JSON list (or one object) or JSONL, one instance a row.

    Rows are numbered from 1 (JSONL: the line number). ``split`` applies to rows that do not say theirs. Raises
    ``InstanceError`` naming the file, the row, the instance id when known and the bad field; a repeated
    ``instance_id`` is an error too.
    """
    path = Path(path)
    if not path.is_file():
        raise InstanceError(f"instance file {path} does not exist")
    instances: list[SweInstance] = []
    seen: dict[str, int] = {}
    for row, data in _rows(path):
        instance = instance_from_row(data, source=str(path), row=row, split=split)
        if instance.instance_id in seen:
            raise InstanceError(
                f"{path}: row {row}: instance_id {instance.instance_id!r} repeats row {seen[instance.instance_id]}"
            )
        seen[instance.instance_id] = row
        instances.append(instance)
    return instances


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by POSIX relative path (sorted), without ``.git`` and caches."""
    files: dict[str, bytes] = {}
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part in SKIPPED_NAMES for part in relative.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            raise InstanceError(f"{path}: symlinks are not supported in a suite instance")
        if path.is_file():
            files[relative.as_posix()] = path.read_bytes()
    return files


def _text(path: str, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise InstanceError(f"{path}: binary files cannot be part of a diff") from None


def unified_diff(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> str:
    """The git-style unified diff turning ``before`` into ``after`` (both: relative path -> content).

    Only files whose content differs appear, in path order, with ``a/``/``b/`` prefixes; a file absent from
    ``before`` is created from ``/dev/null`` and one absent from ``after`` is deleted. A last line without a
    newline is marked ``\\ No newline at end of file``, so ``git apply`` and ``patch -p1`` reproduce ``after``.
    """
    chunks: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new:
            continue
        old_lines = _text(path, old).splitlines(keepends=True) if old is not None else []
        new_lines = _text(path, new).splitlines(keepends=True) if new is not None else []
        header = [f"diff --git a/{path} b/{path}\n"]
        if old is None:
            header.append("new file mode 100644\n")
        elif new is None:
            header.append("deleted file mode 100644\n")
        body = difflib.unified_diff(
            old_lines,
            new_lines,
            fromfile="/dev/null" if old is None else f"a/{path}",
            tofile="/dev/null" if new is None else f"b/{path}",
            lineterm="\n",
        )
        chunks.extend(header)
        for line in body:
            chunks.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(chunks)


def overlay(base: Mapping[str, bytes], top: Mapping[str, bytes]) -> dict[str, bytes]:
    """``base`` with the files of ``top`` added or replaced (sorted by path)."""
    return dict(sorted({**base, **top}.items()))


def load_suite_instance(directory: Path) -> SweInstance:
    """One local suite instance (``instance.yaml``, ``repo/``, ``fix/``, ``hidden_tests/``) with its diffs computed.

    ``patch`` is ``repo/ -> repo/ + fix/`` and ``test_patch`` is ``repo/ -> repo/ + hidden_tests/``. Raises
    ``InstanceError`` naming the directory and the field or folder at fault.
    """
    directory = Path(directory)
    spec_path = directory / SUITE_FILE
    try:
        data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InstanceError(f"{directory}: cannot read {SUITE_FILE}: {exc}") from None
    if not isinstance(data, Mapping):
        raise InstanceError(f"{spec_path}: expected a mapping of fields")
    for name in SUITE_DIRS:
        if not (directory / name).is_dir():
            raise InstanceError(f"{directory}: {name}/ is missing")
    unknown = sorted(set(data) - RECORD_FIELDS)
    if unknown:
        raise InstanceError(f"{spec_path}: unknown field(s) {unknown}")
    for computed in ("patch", "test_patch"):
        if computed in data:
            raise InstanceError(f"{spec_path}: field {computed} is computed from the folders; remove it")
    base = snapshot(directory / "repo")
    fix = snapshot(directory / "fix")
    hidden = snapshot(directory / "hidden_tests")
    for name, files in (("fix", fix), ("hidden_tests", hidden)):
        if not files:
            raise InstanceError(f"{directory}: {name}/ holds no files")
    patch = unified_diff(base, overlay(base, fix))
    if not patch:
        raise InstanceError(f"{directory}: fix/ changes nothing in repo/")
    fields = {**data, "patch": patch, "test_patch": unified_diff(base, overlay(base, hidden))}
    try:
        instance = SweInstance(**fields)
    except ValidationError as exc:
        raise _row_error(str(spec_path), None, data, exc) from None
    if not re.match(SUITE_ID_PATTERN, instance.instance_id):
        raise InstanceError(f"{spec_path}: field instance_id: {instance.instance_id!r} must match {SUITE_ID_PATTERN}")
    if instance.instance_id != directory.name:
        raise InstanceError(f"{spec_path}: field instance_id {instance.instance_id!r} differs from its directory")
    if instance.bug_kind is None:
        raise InstanceError(f"{spec_path}: field bug_kind is required in the local suite")
    return instance


def suite_instances(suite: Path) -> list[Path]:
    """The instance directories of a local suite (those holding ``instance.yaml``), sorted by name."""
    suite = Path(suite)
    if not suite.is_dir():
        return []
    return [d for d in sorted(suite.iterdir()) if d.is_dir() and (d / SUITE_FILE).is_file()]


def load_suite(suite: Path, *, split: Split | Literal["all"] = "all") -> list[SweInstance]:
    """Every instance of a local suite (sorted by id), or those of one split."""
    instances = [load_suite_instance(directory) for directory in suite_instances(suite)]
    return [instance for instance in instances if split == "all" or instance.split == split]
