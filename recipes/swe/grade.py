"""The Orchard-SWE grader: SWE-bench semantics, run over the episode's working copy after the harness exits.

Standard library only: ``recipes.swe.build`` ships this file into every task's ``hidden/`` with the task's
``instance.json``. The Env places both in a read-only directory outside the working copy once every process of the
agent is dead, and runs ``python3 -I "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy. Steps:

1. **What the agent changed**: every file of the working copy is compared with the base snapshot's sha256 manifest
   (``base_files``), so the answer does not depend on a ``.git`` the runtime may strip or the agent may rewrite.
2. **Reset the graded tests**: the files the hidden test patch touches, the files holding a graded test id and every
   base ``conftest.py`` and pytest configuration file go back to their base content (``restore``), so edits to the
   tests that decide the reward count for nothing.
3. **Scrub what would run besides the code under test** (``scrub``): every ``__pycache__`` and ``*.pyc`` (an
   unchecked-hash ``.pyc`` is imported without its source), and every ``conftest.py``, pytest configuration file
   (``PYTEST_CONFIG_NAMES``), ``sitecustomize.py``/``usercustomize.py`` and ``*.pth`` that is not the base file.
4. **Apply the hidden test patch** with ``git apply`` (outside any repository and configuration of the agent's: a
   filter in its ``.git/config`` would run), or, where git is missing or refuses, with the small unified diff
   applier below.
5. **Run** ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` in one pytest run, outcomes recorded per test id by an in-process
   plugin; ids the run did not report (a collection error, an id the agent deleted) are run again one by one, and
   count as failing if still unreported. A test passes when it passed or was an expected failure, as in SWE-bench.
   The agent's code is the code under test, so it runs inside pytest; nothing else of the agent's is loaded: the
   runner is ``sys.executable -I -B`` with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` and ``-p no:cacheprovider``,
   pytest is imported before the working copy is on ``sys.path``, the working copy then goes last
   (``--import-mode=append``; entries pytest's ``pythonpath`` option puts first move last at session start), and a
   standard-library module name is always resolved outside the working copy (a planted ``json.py`` or ``re.py``
   is never imported).

Exit status 0 (success, reward 1) only when every ``FAIL_TO_PASS`` and every ``PASS_TO_PASS`` test passes.
``$ORCHARD_GRADER_OUT/signals.json`` holds:

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

OUT_ENV = "ORCHARD_GRADER_OUT"
SIGNALS_NAME = "signals.json"
INSTANCE_FILE = Path(__file__).resolve().parent / "instance.json"
IGNORED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache"})
PYTEST_CONFIG_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
"""Files that configure pytest (plugins, ``addopts``, hooks) wherever they are: reset to their base content."""
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
"""Files Python runs at start-up when found on its path (as it does ``*.pth`` files in a site directory)."""
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_RERUNS = 100
DEFAULT_TEST_TIMEOUT_S = 600.0

RUNNER = r"""
import importlib.machinery, json, os, pkgutil, sys, sysconfig

root = os.path.realpath(os.getcwd())


def inside(entry):
    path = os.path.realpath(entry or os.curdir)
    return path == root or path.startswith(root + os.sep)


# pytest comes from the interpreter's own path: a pytest.py or _pytest/ planted in the working copy cannot stand in
sys.path[:] = [p for p in sys.path if not inside(p)]
import pytest

sys.path.append(root)


paths = sysconfig.get_paths()
stdlib = getattr(sys, "stdlib_module_names", None) or {  # before 3.10: what the stdlib directories hold
    m.name for m in pkgutil.iter_modules([paths["stdlib"], os.path.join(paths["platstdlib"], "lib-dynload")])
}


class StandardLibraryFirst:
    # a standard-library name is found outside the working copy, wherever pytest or a test puts it on sys.path
    @staticmethod
    def find_spec(name, path=None, target=None):
        if path is not None or name not in stdlib:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [p for p in sys.path if not inside(p)])
        return spec if spec is not None and spec.loader is not None else None


sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder), StandardLibraryFirst)
out, args = sys.argv[1], sys.argv[2:]
outcomes = {}


class Recorder:
    def pytest_sessionstart(self, session):
        # the ini option pythonpath (and conftests) put entries first: the working copy's go last again
        sys.path[:] = [p for p in sys.path if not inside(p)] + [p for p in sys.path if inside(p)]

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
    """sha256 of every regular file of the working copy by relative path, without VCS and caches."""
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

    git runs outside any repository and with no system or global configuration: the working copy's ``.git`` is the
    agent's, and a filter driver in its config would run while git reads the files it patches. Returns which
    applied (``git`` or ``stdlib``); raises ``PatchError`` when neither could.
    """
    git = shutil.which("git")
    if git is not None:
        with tempfile.TemporaryDirectory(prefix="orchard-swe-git-") as scratch:
            env = {
                "PATH": os.environ.get("PATH", os.defpath),
                "HOME": scratch,
                "GIT_DIR": str(Path(scratch) / "no-repository"),
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": os.devnull,
            }
            done = subprocess.run(  # noqa: S603
                [git, "apply", "--whitespace=nowarn", "-"], cwd=root, input=diff.encode(), env=env, capture_output=True
            )
        if done.returncode == 0:
            return "git"
    apply_patch_stdlib(root, diff)
    return "stdlib"


# ---------------------------------------------------------------------------------------------------- reset
def remove(path: Path) -> None:
    """Remove a file, a link or a whole directory (never following a link)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def real_parents(root: Path, relative: str) -> Path:
    """``root / relative`` with every parent a real directory (a link or file in the way is removed), so that
    writing the path never lands outside the working copy."""
    current = root
    for part in Path(relative).parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
    return root / relative


def restore(root: Path, files: Mapping[str, str | None]) -> None:
    """Put ``files`` back to their base content (``None``: absent at base, removed)."""
    for path, content in sorted(files.items()):
        target = real_parents(root, path)
        remove(target)
        if content is not None:
            target.write_text(content, encoding="utf-8")


def is_base_file(path: Path, relative: str, base: Mapping[str, str]) -> bool:
    """Whether ``path`` is a regular file (not a link) with its base content."""
    return not path.is_symlink() and path.is_file() and base.get(relative) == sha256(path.read_bytes())


def scrub(root: Path, base: Mapping[str, str]) -> list[str]:
    """Remove every ``__pycache__`` and ``*.pyc``, and every pytest configuration or start-up file that is not its
    base file (added, changed, or a link); returns the removed paths, relative."""
    removed: list[str] = []
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        for name in sorted(set(dirs) & {"__pycache__"}):
            remove(here / name)
            removed.append((here / name).relative_to(root).as_posix())
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", ".git"))
        for name in sorted(files):
            path = here / name
            relative = path.relative_to(root).as_posix()
            configures = name in PYTEST_CONFIG_NAMES or name in STARTUP_NAMES or name.endswith(".pth")
            if name.endswith(".pyc") or (configures and not is_base_file(path, relative, base)):
                path.unlink()
                removed.append(relative)
    return removed


# ---------------------------------------------------------------------------------------------------- tests
def runner_env() -> dict[str, str]:
    """The test runner's environment: this one without pytest's and Python's variables, plugin autoload off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    return {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # 3.8 has no dict |


def run_pytest(root: Path, test_ids: list[str], timeout_s: float) -> dict[str, str]:
    """One pytest run of ``test_ids`` in ``root``; outcome (``passed``/``failed``/``skipped``) by reported node id."""
    with tempfile.TemporaryDirectory(prefix="orchard-swe-grade-") as scratch:
        out = Path(scratch) / "report.json"
        argv = [sys.executable, "-I", "-B", "-c", RUNNER, str(out), "-q", "-p", "no:cacheprovider"]
        argv += ["--import-mode=append", "--rootdir", str(root)]
        try:
            subprocess.run(  # noqa: S603
                [*argv, *test_ids], cwd=root, env=runner_env(), timeout=timeout_s, check=False
            )
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


def reset(root: Path, instance: Mapping[str, Any]) -> bool:
    """Restore the graded tests and the pytest configuration, scrub, apply the hidden test patch; whether it
    applied."""
    restore(root, instance.get("restore", {}))
    for path in scrub(root, instance["base_files"]):
        sys.stderr.write(f"grade: removed {path}\n")
    try:
        how = apply_patch(root, instance["test_patch"])
    except (PatchError, OSError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"grade: the hidden test patch does not apply: {exc}\n")
        return False
    sys.stderr.write(f"grade: hidden test patch applied ({how})\n")
    return True


def grade(root: Path, instance: Mapping[str, Any]) -> dict[str, float]:
    """Grade the working copy ``root`` against ``instance`` (the shipped ``instance.json``); returns the signals."""
    base: dict[str, str] = instance["base_files"]
    changed = changed_files(root, base)
    reference = list(instance["reference_files"])
    touched = sum(path in changed for path in reference) / len(reference) if reference else 0.0
    applied = reset(root, instance)
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


def signals_path() -> Path:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return Path(out) / SIGNALS_NAME


def main() -> int:
    """Grade the current directory; exit status 0 only when every graded test passes."""
    target = signals_path()
    instance = json.loads(INSTANCE_FILE.read_text(encoding="utf-8"))
    signals = grade(Path.cwd(), instance)
    target.write_text(json.dumps(signals, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(signals, sort_keys=True) + "\n")
    return 0 if signals["resolved"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
