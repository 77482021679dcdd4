"""The Orchard-SWE grader: SWE-bench semantics, run in the episode's working copy after the harness exits.

Standard library only: ``recipes.swe.build`` ships this file into every task's ``hidden/.grader/`` with the task's
``instance.json``; the Env copies both in once the agent is gone and runs ``python3 .grader/grade.py``. Steps:

1. **What the agent changed**: every file of the working copy is compared with the base snapshot's sha256 manifest
   (``base_files``), so the answer does not depend on a ``.git`` the runtime may strip or the agent may rewrite.
2. **Reset the graded tests**: the files the hidden test patch touches, the files holding a graded test id and every
   ``conftest.py`` go back to their base content (``restore``; an agent-added ``conftest.py`` is removed), so edits
   to the tests that decide the reward count for nothing.
3. **Apply the hidden test patch** with ``git apply``, or, where git is missing or refuses, with the small unified
   diff applier below.
4. **Run** ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` in one pytest run (``sys.executable``, the interpreter running this
   file), outcomes recorded per test id by an in-process plugin; ids the run did not report (a collection error, an
   id the agent deleted) are run again one by one, and count as failing if still unreported. A test passes when it
   passed or was an expected failure, as in SWE-bench.

Exit status 0 (success, reward 1) only when every ``FAIL_TO_PASS`` and every ``PASS_TO_PASS`` test passes.
``.orchard-signals.json`` holds:

===========================  ====================================================================================
``f2p_fraction``             fraction of ``FAIL_TO_PASS`` tests passing
``p2p_fraction``             fraction of ``PASS_TO_PASS`` tests passing (1.0 when there are none)
``touched_reference_files``  fraction of the reference fix's files that the agent changed
``wrote_tests``              1 when the agent added or changed a test file (under ``tests/``/``test/``, or named
                             ``test_*.py``/``*_test.py``), before the reset
``files_changed``            how many files the agent added, changed or deleted
``test_patch_applied``       1 when the hidden test patch applied (0 makes the grade a failure)
``resolved``                 1 on success (the same as the exit status)
===========================  ====================================================================================

Whether the agent *ran* the tests cannot be read from the end state; it is a property of the trajectory (the
recorded tool calls), left to a step reward.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SIGNALS_FILE = ".orchard-signals.json"
GRADER_DIR = ".grader"
INSTANCE_FILE = Path(__file__).resolve().parent / "instance.json"
IGNORED_NAMES = frozenset({".git", GRADER_DIR, "__pycache__", ".pytest_cache", SIGNALS_FILE})
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_RERUNS = 100
DEFAULT_TEST_TIMEOUT_S = 600.0

RUNNER = r"""
import json, os, sys
cwd = os.getcwd()
# import pytest from the interpreter's own path first: a pytest.py planted in the working copy cannot stand in
sys.path[:] = [p for p in sys.path if p not in ("", cwd)]
import pytest
sys.path.insert(0, cwd)
out, args = sys.argv[1], sys.argv[2:]
outcomes = {}


class Recorder:
    def pytest_runtest_logreport(self, report):
        node = report.nodeid
        if report.failed:
            outcomes[node] = "failed"
        elif outcomes.get(node) == "failed":
            return
        elif report.when == "call":
            outcomes[node] = "passed" if report.passed or hasattr(report, "wasxfail") else "skipped"
        elif report.skipped:
            outcomes[node] = "passed" if hasattr(report, "wasxfail") else "skipped"

    def pytest_collectreport(self, report):
        if report.failed:
            outcomes["<collect>" + report.nodeid] = "failed"


code = pytest.main(args, plugins=[Recorder()])
with open(out, "w", encoding="utf-8") as handle:
    json.dump({"exit": int(code), "outcomes": outcomes}, handle)
"""


def sha256(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def working_files(root: Path) -> dict[str, str]:
    """sha256 of every regular file of the working copy by relative path, without VCS, caches and the grader."""
    found: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in IGNORED_NAMES)
        for name in files:
            path = Path(directory, name)
            relative = path.relative_to(root).as_posix()
            if name in IGNORED_NAMES or name.endswith(".pyc") or path.is_symlink() or not path.is_file():
                continue
            found[relative] = sha256(path.read_bytes())
    return found


def changed_files(root: Path, base: Mapping[str, str]) -> list[str]:
    """Paths added, changed or deleted relative to the base manifest (path -> sha256), sorted."""
    now = working_files(root)
    return sorted(path for path in set(now) | set(base) if now.get(path) != base.get(path))


def is_test_path(path: str) -> bool:
    """Whether ``path`` is a test file by pytest's usual conventions."""
    parts = path.split("/")
    name = parts[-1]
    return any(part in {"tests", "test"} for part in parts[:-1]) or (
        name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))
    )


# ---------------------------------------------------------------------------------------------------- patches
class PatchError(Exception):
    """A diff does not parse or does not apply."""


def parse_diff(diff: str) -> list[tuple[str | None, str | None, list[tuple[int, list[str], list[str]]]]]:
    """A unified diff as ``(old_path, new_path, hunks)`` per file (``None`` for ``/dev/null``); a hunk is
    ``(old_start, old_lines, new_lines)`` with line endings kept."""
    lines = diff.splitlines(keepends=True)
    files: list[tuple[str | None, str | None, list[tuple[int, list[str], list[str]]]]] = []
    i = 0

    def strip(name: str) -> str | None:
        name = name.rstrip("\r\n").split("\t")[0]
        if name == "/dev/null":
            return None
        return name[2:] if name.startswith(("a/", "b/")) else name

    while i < len(lines):
        if not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
            i += 1
            continue
        old_path, new_path = strip(lines[i][4:]), strip(lines[i + 1][4:])
        hunks: list[tuple[int, list[str], list[str]]] = []
        i += 2
        while i < len(lines) and (match := HUNK_HEADER.match(lines[i])):
            old_left = int(match.group(2) if match.group(2) is not None else 1)
            new_left = int(match.group(4) if match.group(4) is not None else 1)
            old_block: list[str] = []
            new_block: list[str] = []
            last: list[list[str]] = []
            i += 1
            while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
                line = lines[i]
                tag, text = line[:1], line[1:]
                if tag == "\\":  # "\ No newline at end of file": the previous line has no newline
                    for block in last:
                        block[-1] = block[-1].rstrip("\r\n")
                elif tag in (" ", "\n"):
                    text = text if tag == " " else "\n"
                    old_block.append(text)
                    new_block.append(text)
                    old_left, new_left, last = old_left - 1, new_left - 1, [old_block, new_block]
                elif tag == "-":
                    old_block.append(text)
                    old_left, last = old_left - 1, [old_block]
                elif tag == "+":
                    new_block.append(text)
                    new_left, last = new_left - 1, [new_block]
                else:
                    raise PatchError(f"unexpected line in a hunk of {new_path or old_path}: {line[:80]!r}")
                i += 1
            if old_left or new_left:
                raise PatchError(f"truncated hunk in {new_path or old_path}")
            hunks.append((int(match.group(1)), old_block, new_block))
        files.append((old_path, new_path, hunks))
    if not files and diff.strip():
        raise PatchError("no file headers (--- / +++) in the diff")
    return files


def apply_hunks(content: list[str], hunks: Iterable[tuple[int, list[str], list[str]]]) -> list[str]:
    """``content`` (lines) with the hunks applied in order; each found at its line or the nearest offset."""
    result = list(content)
    shift = 0
    for start, old_block, new_block in hunks:
        expected = max(start - 1, 0) + shift if old_block else start + shift
        candidates = sorted(range(len(result) - len(old_block) + 1), key=lambda at: abs(at - expected))
        at = next((c for c in candidates if result[c : c + len(old_block)] == old_block), None)
        if at is None:
            raise PatchError(f"hunk at line {start} does not apply")
        result[at : at + len(old_block)] = new_block
        shift += len(new_block) - len(old_block)
    return result


def apply_patch_stdlib(root: Path, diff: str) -> None:
    """Apply a unified diff under ``root`` without external tools: creations, deletions and modifications."""
    for old_path, new_path, hunks in parse_diff(diff):
        target = root / (new_path or old_path or "")
        if new_path is None:
            target.unlink(missing_ok=True)
            continue
        if old_path is None:
            before: list[str] = []
        else:
            source = root / old_path
            if not source.is_file():
                raise PatchError(f"{old_path} does not exist")
            before = source.read_text(encoding="utf-8").splitlines(keepends=True)
        after = apply_hunks(before, hunks)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(after), encoding="utf-8")


def apply_patch(root: Path, diff: str) -> str:
    """Apply ``diff`` under ``root``: ``git apply`` when git is there and accepts it, else the stdlib applier.

    Returns which applied (``git`` or ``stdlib``); raises ``PatchError`` when neither could.
    """
    git = shutil.which("git")
    if git is not None:
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.resolve().parent)}
        done = subprocess.run(  # noqa: S603
            [git, "apply", "--whitespace=nowarn", "-"], cwd=root, input=diff.encode(), env=env, capture_output=True
        )
        if done.returncode == 0:
            return "git"
    apply_patch_stdlib(root, diff)
    return "stdlib"


def restore(root: Path, files: Mapping[str, str | None], base: Mapping[str, str]) -> None:
    """Put ``files`` back to their base content (``None``: absent at base, removed) and remove added conftests."""
    for path, content in sorted(files.items()):
        target = root / path
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        if content is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
    for path in working_files(root):
        if path.split("/")[-1] == "conftest.py" and path not in base:
            (root / path).unlink()


# ---------------------------------------------------------------------------------------------------- tests
def run_pytest(root: Path, test_ids: list[str], timeout_s: float) -> dict[str, str]:
    """One pytest run of ``test_ids`` in ``root``; outcome (``passed``/``failed``/``skipped``) by reported node id."""
    with tempfile.TemporaryDirectory(prefix="orchard-swe-grade-") as scratch:
        out = Path(scratch) / "report.json"
        argv = [sys.executable, "-c", RUNNER, str(out), "-q", "-p", "no:cacheprovider", "--rootdir", str(root)]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            subprocess.run([*argv, *test_ids], cwd=root, env=env, timeout=timeout_s, check=False)  # noqa: S603
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"grade: pytest timed out after {timeout_s:.0f} s\n")
        try:
            return dict(json.loads(out.read_text(encoding="utf-8"))["outcomes"])
        except (OSError, ValueError, KeyError, TypeError):
            return {}


def graded_outcomes(root: Path, test_ids: list[str], timeout_s: float) -> dict[str, bool]:
    """Whether each of ``test_ids`` passed: one run of all, then the unreported ones again one by one."""
    wanted = list(dict.fromkeys(test_ids))
    outcomes = run_pytest(root, wanted, timeout_s) if wanted else {}
    missing = [test_id for test_id in wanted if test_id not in outcomes]
    for test_id in missing[:MAX_RERUNS]:
        outcomes.update({k: v for k, v in run_pytest(root, [test_id], timeout_s).items() if k == test_id})
    return {test_id: outcomes.get(test_id) == "passed" for test_id in wanted}


def fraction(passed: Mapping[str, bool], test_ids: list[str]) -> float:
    """Fraction of ``test_ids`` that passed (1.0 for none)."""
    return sum(passed[t] for t in test_ids) / len(test_ids) if test_ids else 1.0


def grade(root: Path, instance: Mapping[str, Any]) -> dict[str, float]:
    """Grade the working copy ``root`` against ``instance`` (the shipped ``instance.json``); returns the signals."""
    base: dict[str, str] = instance["base_files"]
    changed = changed_files(root, base)
    reference = list(instance["reference_files"])
    touched = sum(path in changed for path in reference) / len(reference) if reference else 0.0
    restore(root, instance.get("restore", {}), base)
    try:
        how = apply_patch(root, instance["test_patch"])
        sys.stderr.write(f"grade: hidden test patch applied ({how})\n")
        applied = True
    except (PatchError, OSError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"grade: the hidden test patch does not apply: {exc}\n")
        applied = False
    f2p, p2p = list(instance["FAIL_TO_PASS"]), list(instance["PASS_TO_PASS"])
    passed: dict[str, bool] = {t: False for t in f2p + p2p}
    if applied:
        passed = graded_outcomes(root, f2p + p2p, float(instance.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S)))
    for test_id in f2p + p2p:
        sys.stderr.write(f"grade: {'PASS' if passed[test_id] else 'FAIL'} {test_id}\n")
    resolved = applied and all(passed.values())
    return {
        "f2p_fraction": round(fraction(passed, f2p), 6),
        "p2p_fraction": round(fraction(passed, p2p), 6),
        "touched_reference_files": round(touched, 6),
        "wrote_tests": float(any(is_test_path(path) for path in changed)),
        "files_changed": float(len(changed)),
        "test_patch_applied": float(applied),
        "resolved": float(resolved),
    }


def main() -> int:
    """Grade the current directory; exit status 0 only when every graded test passes."""
    instance = json.loads(INSTANCE_FILE.read_text(encoding="utf-8"))
    signals = grade(Path.cwd(), instance)
    Path(SIGNALS_FILE).write_text(json.dumps(signals, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(signals, sort_keys=True) + "\n")
    return 0 if signals["resolved"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
