"""One command running in a sandbox: its pipes, its deadline, and killing its whole process tree.

The command is started (already wrapped by ``orchard.sandbox.local.isolation``) as the leader of a new session. With
namespaces, the process started here is ``unshare``, whose child is PID 1 of the command's own PID namespace:
killing that child makes the kernel kill every process in the namespace, however it was daemonised. Without
namespaces, the session's process group is killed. After the command itself exits, what it left running is killed
too (with namespaces that happens by itself), so nothing outlives an ``exec``.

Exit statuses follow the shell's convention: a command killed by signal N exits ``128 + N``.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Literal

Stream = Literal["stdout", "stderr"]
CHUNK = 65536
DRAIN_AFTER_EXIT_S = 0.2
"""After the command exits, how long to keep reading output that processes it left behind still write."""
POLL_S = 0.5
KILL_WAIT_S = 5.0
"""How long a killed namespace may take to empty before its process group is killed too."""


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    stdin: int | IO[bytes] | None,
    stdout: int | IO[bytes] | None,
    stderr: int | IO[bytes] | None,
    new_session: bool = True,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with exactly ``env`` (nothing of the host's environment) and no inherited descriptors
    besides ``pass_fds``."""
    return subprocess.Popen(  # noqa: S603 - argv built by orchard.sandbox.local.isolation
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        start_new_session=new_session,
    )


def shell_status(returncode: int) -> int:
    """``Popen.returncode`` as a shell reports it (``-N`` for signal N becomes ``128 + N``)."""
    return 128 - returncode if returncode < 0 else returncode


def kill_tree(process: subprocess.Popen[bytes], *, namespaced: bool) -> None:
    """SIGKILL everything the command started, and return once it is all gone.

    With namespaces: kill PID 1 of the command's namespace and wait for ``unshare`` to report it dead, which the
    kernel does only after every process of the namespace has exited. Otherwise (or if that takes too long, or the
    namespace does not exist yet): kill the session's process group."""
    if namespaced:
        children = _children(process.pid)
        for child in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        if children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_WAIT_S)
                return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()  # reaped, or the group would never look empty
    kill_group(process.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group and wait (at most ``KILL_WAIT_S``) until none of it is left but zombies (orphans
    wait for the machine's init to reap them, which may take a while)."""
    deadline = time.monotonic() + KILL_WAIT_S
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.002)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(part) for part in handle.read().split()]
    except (OSError, ValueError):
        return []


class RunningCommand:
    """A started command whose output is read until it ends or its deadline passes."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str,
        timeout_s: float,
        namespaced: bool,
        stdin: bytes | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """Start the command now; its deadline is ``timeout_s`` from now."""
        self.namespaced = namespaced
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s
        self.timed_out = False
        self._stdin = memoryview(stdin or b"")
        self.process = spawn(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
        )

    @property
    def duration_ms(self) -> float:
        """Time since the start."""
        return (time.monotonic() - self.started) * 1000.0

    def output(self) -> Iterator[tuple[Stream, bytes]]:
        """Output chunks as they come; when this ends the command has ended (or was killed at its deadline)."""
        process = self.process
        if process.stdout is None or process.stderr is None:
            raise RuntimeError("command started without output pipes")
        selector = selectors.DefaultSelector()
        for name, pipe in (("stdout", process.stdout), ("stderr", process.stderr)):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe.fileno(), selectors.EVENT_READ, name)
        if process.stdin is not None:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        try:
            yield from self._pump(selector)
        finally:
            selector.close()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    pipe.close()

    def _pump(self, selector: selectors.BaseSelector) -> Iterator[tuple[Stream, bytes]]:
        exited_at: float | None = None
        while any(key.data != "stdin" for key in selector.get_map().values()):
            now = time.monotonic()
            if now >= self.deadline:
                self.timed_out = True
                return
            if exited_at is None and self.process.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT_S:
                return
            wait = min(self.deadline - now, DRAIN_AFTER_EXIT_S / 4 if exited_at is not None else POLL_S)
            for key, _ in selector.select(wait):
                if key.data == "stdin":
                    self._feed(selector, key.fd)
                    continue
                data = os.read(key.fd, CHUNK)
                if data:
                    yield key.data, data
                else:
                    selector.unregister(key.fd)

    def _feed(self, selector: selectors.BaseSelector, fd: int) -> None:
        try:
            written = os.write(fd, self._stdin[:CHUNK])
        except BlockingIOError:
            written = 0
        except BrokenPipeError:  # the command stopped reading: the rest of its input is dropped
            written = len(self._stdin)
        self._stdin = self._stdin[written:]
        if not self._stdin:
            selector.unregister(fd)
            if self.process.stdin is not None:
                self.process.stdin.close()

    def finish(self) -> int | None:
        """Wait for the exit (killing the tree at the deadline) and clean up what it left; the shell-style exit
        status, or ``None`` when the deadline killed it."""
        if not self.timed_out:
            try:
                self.process.wait(timeout=max(self.deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self.timed_out = True
        if self.timed_out:
            self.kill()
            self.process.wait()
            return None
        if not self.namespaced:  # with namespaces, the kernel already killed what PID 1 left behind
            kill_group(self.process.pid)
        return shell_status(self.process.returncode)

    def kill(self) -> None:
        """Kill the command's whole tree now (idempotent)."""
        if self.process.poll() is None:
            kill_tree(self.process, namespaced=self.namespaced)

    close = kill
