"""Processes of the local services: started detached in their own session with a pid file and a log, found again
through ``/proc`` (the command line guards against pid reuse), and stopped together (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

LOG_TAIL_LINES = 40

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # keeps started children reapable (no zombies, no warnings)


def _proc_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``marker`` in its command line (guards against pid reuse)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        # our own child: its exit status is the truth (its /proc cmdline can lag behind the exec under load)
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and marker in cmdline


def _read_pid(pid_file: Path, marker: str) -> int | None:
    """The live pid recorded in ``pid_file``, or None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _proc_alive(pid, marker) else None


def _spawn(cmd: list[str], log_file: Path, pid_file: Path, cwd: Path) -> int:
    """Start ``cmd`` detached in its own session, output appended to ``log_file``; returns its pid."""
    with log_file.open("ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        log.flush()
        child = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )
    _CHILDREN[child.pid] = child
    pid_file.write_text(f"{child.pid}\n")
    return child.pid


def _terminate(processes: list[tuple[Path, str]], timeout_s: float) -> int:
    """Stop the processes of ``(pid_file, marker)`` pairs together: SIGTERM all, wait up to ``timeout_s``, SIGKILL.

    Together, because a KRaft node stopped last, alone, has no quorum to shut down against. Returns how many ran.
    """
    running = [(pid, marker) for pid_file, marker in processes if (pid := _read_pid(pid_file, marker)) is not None]
    for pid, _ in running:
        _signal_group(pid, signal.SIGTERM)

    def all_gone() -> bool:
        return not any(_proc_alive(pid, marker) for pid, marker in running)

    if not _wait(all_gone, timeout_s):
        for pid, marker in running:
            if _proc_alive(pid, marker):
                _note(f"pid {pid} did not stop within {timeout_s:.0f} s of SIGTERM; sending SIGKILL")
                _signal_group(pid, signal.SIGKILL)
        _wait(all_gone, 10.0)
    for pid_file, _ in processes:
        pid_file.unlink(missing_ok=True)
    return len(running)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # started with start_new_session: the pid is its group id


def _wait(done: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def _log_tail(log_file: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_file.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
