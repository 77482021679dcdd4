"""The Orchard-SWE grader: SWE-bench semantics, run over the episode's working copy after the harness exits.

Standard library only: ``recipes.swe.build`` ships this file into every task's ``hidden/`` with ``grade_runner.py``
and the task's ``instance.json``. The Env places them in a read-only directory outside the working copy once every
process of the agent is dead, and runs ``python3 -I "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy. Steps:

1. **What the agent changed**: every file of the working copy is compared with the base snapshot's sha256 manifest
   (``base_files``), so the answer does not depend on a ``.git`` the runtime may strip or the agent may rewrite.
2. **Reset the tests**: every test directory (``test_dirs``: ``tests/``, ``test/``, ``testing/`` and the directories
   that hold only tests, chosen at build time) is removed whole, then it, the files the hidden test patch touches,
   the files holding a graded test id and every base ``conftest.py`` and pytest configuration file get their base
   content back (``restore``): an agent-added ``tests/__init__.py`` never runs, and edits to the tests that decide
   the reward count for nothing.
3. **Scrub what would run besides the code under test** (``scrub``): every ``__pycache__`` and ``*.pyc`` (an
   unchecked-hash ``.pyc`` is imported without its source), and every ``conftest.py``, pytest configuration file
   (``PYTEST_CONFIG_NAMES``), ``sitecustomize.py``/``usercustomize.py`` and ``*.pth`` that is not the base file.
4. **Apply the hidden test patch** with ``git apply`` (outside any repository and configuration of the agent's: a
   filter in its ``.git/config`` would run), or, where git is missing or refuses, with the small unified diff
   applier below.
5. **Run** ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` in one run of ``grade_runner.py`` (shipped beside this file; its
   docstring says how it keeps pytest's reports from the code under test and detects tampering), in a process
   group of its own. Its reports come down an inherited pipe, each line carrying a per-run token it read from
   stdin; a run without its ``finish`` line counts for nothing. Ids a run did not report are run again one by one,
   the working copy reset (2-4) before each, and count as failing if still unreported. A test passes when it passed
   or was an expected failure of a test marked ``xfail``, as in SWE-bench. Tampering fails every test.
6. **Stop what the tests started**: the runner's process group, then, where an Orchard runtime put the grader
   (``contained``), every other process of its PID namespace but PID 1 and this one's ancestors (``kill_strays``).
7. **Write the signals**: ``$ORCHARD_GRADER_OUT`` made writable again, whatever is at ``signals.json`` replaced.

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
``tampered``                 1 when a run found pytest or its recorder tampered with (every test then fails)
``resolved``                 1 on success (the same as the exit status)
===========================  ====================================================================================

Whether the agent *ran* the tests cannot be read from the end state; it is a property of the trajectory (the
recorded tool calls), left to a step reward.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

OUT_ENV = "ORCHARD_GRADER_OUT"
GRADER_DIR_ENV = "ORCHARD_GRADER_DIR"
SIGNALS_NAME = "signals.json"
INSTANCE_FILE = Path(__file__).resolve().parent / "instance.json"
RUNNER_FILE = Path(__file__).resolve().parent / "grade_runner.py"
SANDBOX_GRADER_DIR = re.compile(r"/orchard/grader|/tmp/orchard-grader-[0-9a-f]{24}/grader")
"""Where Orchard's runtimes put the grader (the local runtime's namespaced view; the exec-only default)."""
INIT_PID_NAMESPACE = "pid:[4026531836]"
"""The machine's initial PID namespace (the kernel's fixed ``PROC_PID_INIT_INO``)."""
IGNORED_NAMES = frozenset({".git", "__pycache__", ".pytest_cache"})
PYTEST_CONFIG_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
"""Files that configure pytest (plugins, ``addopts``, hooks) wherever they are: reset to their base content."""
STARTUP_NAMES = frozenset({"sitecustomize.py", "usercustomize.py"})
"""Files Python runs at start-up when found on its path (as it does ``*.pth`` files in a site directory)."""
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
MAX_RERUNS = 100
DEFAULT_TEST_TIMEOUT_S = 600.0
DRAIN_S = 2.0
"""How long the report pipe is read after the runner ended (a writer outside the sweep's reach is not waited for)."""
MAX_REPORT_BYTES = 64 << 20


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
    """Remove a file, a link or a whole directory, however deep and whatever its modes (never following a link)."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    pending, found = [path], []
    while pending:  # iterative: an agent may nest directories far beyond the recursion limit
        directory = pending.pop()
        os.chmod(directory, stat.S_IRWXU)  # an unreadable or read-only directory is still the sandbox user's
        found.append(directory)
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                else:
                    os.unlink(entry.path)
    for directory in reversed(found):
        os.rmdir(directory)


def real_parents(root: Path, relative: str) -> Path:
    """``root / relative`` with every parent a real directory (a link or file in the way is removed), so that
    writing the path never lands outside the working copy."""
    current = root
    for part in Path(relative).parts[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            current.unlink()
        current.mkdir(exist_ok=True)
        if not os.access(current, os.W_OK | os.X_OK):
            os.chmod(current, stat.S_IRWXU)
    return root / relative


def content(value: str | Mapping[str, str]) -> bytes:
    """A file's base content as ``instance.json`` holds it: text, or ``{"base64": ...}`` for other bytes."""
    return value.encode("utf-8") if isinstance(value, str) else base64.b64decode(value["base64"])


def restore(root: Path, files: Mapping[str, Any]) -> None:
    """Put ``files`` back to their base content (``None``: absent at base, removed)."""
    for path, value in sorted(files.items()):
        target = real_parents(root, path)
        remove(target)
        if value is not None:
            target.write_bytes(content(value))


def reset_test_directories(root: Path, directories: Iterable[str]) -> None:
    """Remove each test directory whole (``restore`` then writes its base files back): a file the agent added
    there, a ``tests/__init__.py`` say, never runs."""
    for directory in directories:
        remove(real_parents(root, directory))


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


def reset(root: Path, instance: Mapping[str, Any]) -> bool:
    """Restore the test directories, the graded tests and the pytest configuration, scrub, apply the hidden test
    patch; whether it applied."""
    reset_test_directories(root, instance.get("test_dirs", []))
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


def trusted_files(root: Path, instance: Mapping[str, Any]) -> list[str]:
    """After ``reset``: the files holding base content, and every file the reset wrote or the hidden test patch
    added (everything in a test directory). Only these, of the working copy, may implement an outcome hook."""
    base: Mapping[str, str] = instance["base_files"]
    prefixes = tuple(directory + "/" for directory in instance.get("test_dirs", []))
    reset_files = set(instance.get("restore", {}))
    return sorted(
        path
        for path, digest in working_files(root).items()
        if base.get(path) == digest or path in reset_files or path.startswith(prefixes)
    )


# ---------------------------------------------------------------------------------------------------- processes
def process_stat(pid: int) -> tuple[str, int] | None:
    """``(state, parent pid)`` of a process from ``/proc/<pid>/stat``; ``None`` when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the command name, in parentheses, may hold anything
    return (fields[0], int(fields[1])) if len(fields) > 1 else None


def ancestors() -> set[int]:
    """This process and every process above it."""
    found, pid = set(), os.getpid()
    while pid > 0 and pid not in found:
        found.add(pid)
        parent = process_stat(pid)
        pid = parent[1] if parent is not None else 0
    return found


def contained() -> bool:
    """Whether this grader runs where an Orchard runtime put it: in a PID namespace other than the machine's initial
    one (``INIT_PID_NAMESPACE``), with the grader directory at a runtime's path. Only there does ``kill_strays``
    touch processes it did not start."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
    grader_dir = os.environ.get(GRADER_DIR_ENV, "")
    return namespace != INIT_PID_NAMESPACE and SANDBOX_GRADER_DIR.fullmatch(grader_dir) is not None


def kill_strays(rounds: int = 50) -> int:
    """Kill every process of this PID namespace but PID 1 and this one's ancestors (a daemon the code under test
    left, ``setsid`` or not), until none is left; returns how many were killed. Nothing outside ``contained``."""
    if not contained():
        return 0
    spare, killed = ancestors() | {1}, 0
    for _ in range(rounds):
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in spare]
        alive = [pid for pid in pids if (state := process_stat(pid)) is not None and state[0] not in ("Z", "X")]
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.01)
    return killed


# ---------------------------------------------------------------------------------------------------- tests
class PytestRun(NamedTuple):
    """One run of the runner: outcome by node id, whether it reached its end, what it found tampered with."""

    outcomes: dict[str, str]
    finished: bool
    tampered: list[str]


def runner_env() -> dict[str, str]:
    """The test runner's environment: this one without pytest's, Python's and the grader's variables, plugin
    autoload off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON", "ORCHARD_"))}
    return {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1"}  # 3.8 has no dict |


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill the runner and its process group, then every stray process of the namespace."""
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.kill()  # in case the code under test moved the runner to another group
    process.wait()
    killed = kill_strays()
    if killed:
        sys.stderr.write(f"grade: killed {killed} processes left by the tests\n")


def read_reports(process: subprocess.Popen[bytes], fd: int, timeout_s: float) -> bytes:
    """What the runner writes down ``fd`` until every writer is gone (the runner and whatever it started are killed
    when it exits or at ``timeout_s``; a writer that survives that is not waited for past ``DRAIN_S``); at most
    ``MAX_REPORT_BYTES``."""
    chunks: list[bytes] = []
    size, deadline = 0, time.monotonic() + timeout_s
    ended: float | None = None
    while ended is None or time.monotonic() < ended + DRAIN_S:
        if ended is None and (process.poll() is not None or time.monotonic() >= deadline):
            if process.poll() is None:
                sys.stderr.write(f"grade: pytest timed out after {timeout_s:.0f} s\n")
            stop(process)
            ended = time.monotonic()
        ready, _, _ = select.select([fd], [], [], 0.1)
        data = os.read(fd, 1 << 16) if ready else None
        if data == b"":
            break
        if data and size < MAX_REPORT_BYTES:
            chunks.append(data)
            size += len(data)
    if ended is None:
        stop(process)
    return b"".join(chunks)


def parse_reports(data: bytes, token: str) -> PytestRun:
    """The runner's lines that carry ``token``, as outcomes; a run without exactly one ``finish`` line did not
    finish, and its outcomes do not count."""
    prefix, records = token.encode() + b" ", []
    for line in data.split(b"\n"):
        if line.startswith(prefix):
            with contextlib.suppress(ValueError):
                record = json.loads(line[len(prefix) :].decode("utf-8"))
                records.append(record if isinstance(record, dict) else {})
    finishes = [r for r in records if r.get("event") == "finish"]
    tampered = sorted({str(problem) for r in finishes for problem in r.get("tampered") or ()})
    if len(finishes) > 1:
        tampered.append("more than one finish line")
    for record in records:
        if record.get("event") == "collect":
            sys.stderr.write(f"grade: collection error in {record.get('nodeid')}\n")
    outcomes = outcomes_of(r for r in records if r.get("event") == "report")
    return PytestRun(outcomes if finishes else {}, bool(finishes), tampered)


def outcomes_of(reports: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Outcome by node id from its phases' reports: any failed phase fails it; else its call decides (passed, or an
    expected failure of a test marked ``xfail``); a skip without a call is a skip."""
    outcomes: dict[str, str] = {}
    for report in reports:
        node, outcome = str(report.get("nodeid")), report.get("outcome")
        expected = bool(report.get("xfail")) and bool(report.get("marked"))
        if outcome == "failed":
            outcomes[node] = "failed"
        elif outcomes.get(node) == "failed":
            continue
        elif report.get("when") == "call":
            outcomes[node] = "passed" if (outcome == "passed" or expected) else "skipped"
        elif outcome == "skipped":
            outcomes[node] = "passed" if expected else "skipped"
    return outcomes


def run_pytest(root: Path, test_ids: list[str], timeout_s: float, trusted: list[str]) -> PytestRun:
    """One pytest run of ``test_ids`` in ``root``, in a process group of its own; its reports come down a pipe, each
    line carrying a token the runner reads from stdin."""
    token = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    argv = [sys.executable, "-I", "-B", str(RUNNER_FILE), "-q", "-p", "no:cacheprovider", "--import-mode=append"]
    argv += ["--rootdir", str(root), "--confcutdir", str(root), *test_ids]
    try:
        process = subprocess.Popen(  # noqa: S603
            argv, cwd=root, env=runner_env(), stdin=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True
        )
    finally:
        os.close(write_fd)
    setup = json.dumps({"token": token, "fd": write_fd, "trusted": trusted}) + "\n"
    threading.Thread(target=feed, args=(process, setup.encode()), daemon=True).start()
    try:
        return parse_reports(read_reports(process, read_fd, timeout_s), token)
    finally:
        os.close(read_fd)


def feed(process: subprocess.Popen[bytes], data: bytes) -> None:
    """Write ``data`` to the runner's stdin and close it (nothing if the runner is gone)."""
    with contextlib.suppress(OSError):
        assert process.stdin is not None  # noqa: S101 - started with stdin=PIPE
        process.stdin.write(data)
        process.stdin.close()


def graded_outcomes(root: Path, instance: Mapping[str, Any], test_ids: list[str]) -> tuple[dict[str, bool], list[str]]:
    """Whether each of ``test_ids`` passed, and what was tampered with: one run of all, then each unreported one
    alone, the working copy reset before each run. Tampering fails every test."""
    timeout_s = float(instance.get("test_timeout_s", DEFAULT_TEST_TIMEOUT_S))
    wanted = list(dict.fromkeys(test_ids))
    failed = dict.fromkeys(wanted, False)
    outcomes: dict[str, str] = {}
    for run in range(1 + MAX_RERUNS):
        batch = wanted if run == 0 else [t for t in wanted if t not in outcomes][:1]
        if not batch or (run > 0 and not reset(root, instance)):
            break
        result = run_pytest(root, batch, timeout_s, trusted_files(root, instance))
        if result.tampered:
            return failed, result.tampered
        outcomes.update({k: v for k, v in result.outcomes.items() if run == 0 or k in batch})
        if run > 0 and batch[0] not in outcomes:
            outcomes[batch[0]] = "unreported"
    return {test_id: outcomes.get(test_id) == "passed" for test_id in wanted}, []


def fraction(passed: Mapping[str, bool], test_ids: list[str]) -> float:
    """Fraction of ``test_ids`` that passed (1.0 for none)."""
    return sum(passed[t] for t in test_ids) / len(test_ids) if test_ids else 1.0


def grade(root: Path, instance: Mapping[str, Any]) -> dict[str, float]:
    """Grade the working copy ``root`` against ``instance`` (the shipped ``instance.json``); returns the signals."""
    base: dict[str, str] = instance["base_files"]
    changed = changed_files(root, base)
    reference = list(instance["reference_files"])
    touched = sum(path in changed for path in reference) / len(reference) if reference else 0.0
    applied = reset(root, instance)
    f2p, p2p = list(instance["FAIL_TO_PASS"]), list(instance["PASS_TO_PASS"])
    passed: dict[str, bool] = {t: False for t in f2p + p2p}
    tampered: list[str] = []
    if applied:
        passed, tampered = graded_outcomes(root, instance, f2p + p2p)
    for problem in tampered:
        sys.stderr.write(f"grade: TAMPERED {problem}\n")
    for test_id in f2p + p2p:
        sys.stderr.write(f"grade: {'PASS' if passed[test_id] else 'FAIL'} {test_id}\n")
    resolved = applied and not tampered and all(passed.values())
    return {
        "f2p_fraction": round(fraction(passed, f2p), 6),
        "p2p_fraction": round(fraction(passed, p2p), 6),
        "touched_reference_files": round(touched, 6),
        "wrote_tests": float(any(is_test_path(path) for path in changed)),
        "files_changed": float(len(changed)),
        "test_patch_applied": float(applied),
        "tampered": float(bool(tampered)),
        "resolved": float(resolved),
    }


def signals_path() -> Path:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return Path(out) / SIGNALS_NAME


def write_signals(target: Path, signals: Mapping[str, float]) -> None:
    """Write ``signals`` as a new file at ``target``: its directory made writable again and whatever is at
    ``target`` (a read-only forgery, a link, a directory) removed first."""
    with contextlib.suppress(OSError):
        os.chmod(target.parent, target.parent.stat().st_mode | stat.S_IRWXU)
    remove(target)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(signals, sort_keys=True) + "\n")


def main() -> int:
    """Grade the current directory; exit status 0 only when every graded test passes."""
    target = signals_path()
    instance = json.loads(INSTANCE_FILE.read_text(encoding="utf-8"))
    signals = grade(Path.cwd(), instance)
    kill_strays()
    write_signals(target, signals)
    sys.stdout.write(json.dumps(signals, sort_keys=True) + "\n")
    return 0 if signals["resolved"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
