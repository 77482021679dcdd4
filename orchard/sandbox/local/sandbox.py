"""One sandbox of the local runtime (``LocalSandbox``): its commands and terminals (process trees isolated as
``orchard.sandbox.local.isolation`` describes, each in the sandbox's allow-list view of the machine), its files
(confined to its working copy), grading (``orchard.sandbox.local.grading``), its limits as a whole and its lifetime.
``orchard.sandbox.local.runtime`` makes and finds them; its docstring describes their layout on disk."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from orchard.clock import now_ms
from orchard.sandbox import ExecResult, FileEntry, GraderRun, PtySession, Sandbox, SandboxInfo, SandboxSpec, argv_of
from orchard.sandbox.events import Operation, OperationRecord, SandboxEventPublisher
from orchard.sandbox.exceptions import SandboxError, SandboxNotFoundError, SandboxStartError
from orchard.sandbox.local.grading import LEGACY_SIGNALS_FILE, grader_directories, read_grader_outputs
from orchard.sandbox.local.isolation import SYSTEM_PATH
from orchard.sandbox.local.process import RunningCommand
from orchard.sandbox.local.provisioning import SandboxResources
from orchard.sandbox.local.pty_session import LocalPty
from orchard.sandbox.local.sandbox_view import (
    GRADER_DIR,
    GRADER_OUT,
    INSIDE_HOME,
    INSIDE_ROOT,
    INSIDE_WORK,
    SandboxView,
)
from orchard.sandbox.local.seccomp import filter_fd
from orchard.sandbox.local.uids import kill_processes_of
from orchard.sandbox.local.watchdog import Watched
from orchard.sandbox.safe_fs import ConfinedDirectory

if TYPE_CHECKING:
    from orchard.sandbox.local.runtime import LocalRuntime

PATCH_TIMEOUT_S = 60.0
SANDBOX_USER = "sandbox"

T = TypeVar("T")


class LocalSandbox(Sandbox):
    """A sandbox of the local runtime; thread-safe (commands and file operations may run concurrently)."""

    def __init__(self, runtime: LocalRuntime, spec: SandboxSpec, resources: SandboxResources) -> None:
        """Made by ``LocalRuntime.create`` once its resources are provisioned."""
        self.spec = spec
        self.resources = resources
        self.directory = resources.directory
        self.workdir = resources.workdir
        self.files = ConfinedDirectory(self.workdir, resources.owner)
        self.created_at = time.time()
        self.deadline = time.monotonic() + spec.ttl_s
        self.proxy_endpoint = resources.proxy_endpoint
        self._runtime = runtime
        self._isolation = runtime.isolation
        self._owner = resources.owner
        self._namespace_fds = resources.namespace_fds
        self._events = SandboxEventPublisher(spec, runtime.producer, producer_lock=runtime._producer_lock)
        self._running: set[RunningCommand | LocalPty] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._grading = False
        self._stops: list[str] = []
        self.view = SandboxView.for_sandbox(
            self.workdir, resources.home, resources.tmp, resources.shm, runtime.shared, runtime.etc
        )
        namespaced = self._isolation.namespaces
        self.inside_workdir = INSIDE_WORK if namespaced else str(self.workdir)
        self.inside_home = INSIDE_HOME if namespaced else str(resources.home)

    def _inside(self, host_directory: str) -> str:
        """A directory of the working copy (host path) as the sandbox's commands see it."""
        relative = Path(host_directory).relative_to(self.workdir).as_posix()
        return self.inside_workdir if relative == "." else f"{self.inside_workdir}/{relative}"

    # -- limits -------------------------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a command or terminal is running."""
        with self._lock:
            return bool(self._running)

    @property
    def watched(self) -> Watched:
        """What the watchdog checks (CPU seconds only while the agent runs: grading has its own timeout)."""
        cgroup = self.resources.cgroup
        return Watched(
            name=self.spec.sandbox_id,
            directories=(self.workdir, self.resources.home, self.resources.tmp, self.resources.shm),
            disk_mb=None if self.resources.scratch else self.spec.limits.disk_mb,
            cpu_seconds=self.spec.limits.cpu_seconds,
            cpu_used=cgroup.cpu_seconds if cgroup is not None and not self._grading else None,
            stop=self._limit_stop,
        )

    def _limit_stop(self, reason: str) -> None:
        """Stop everything running because a whole-sandbox limit was reached; the commands report ``reason``."""
        with self._lock:
            self._stops.append(reason)
        self.terminate_all()

    def terminate_all(self) -> None:
        """Kill every process of the sandbox: running commands and terminals, and anything left in its cgroup or
        running as its uid (``SandboxStartError`` if some process survives)."""
        with self._lock:
            running = list(self._running)
        cgroup = self.resources.cgroup
        if cgroup is not None:
            cgroup.kill_all()  # first: a closing command waits for its namespace to empty
        for item in running:
            item.close()
        if self._owner is not None:
            kill_processes_of(self._owner[0])
        if cgroup is not None and not cgroup.kill_all():
            raise SandboxStartError(f"sandbox {self.spec.sandbox_id!r}: processes survived SIGKILL")

    # -- commands -----------------------------------------------------------------------------------------------

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 60.0,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command (a string runs through ``/bin/sh -c``) and wait for it; kill its tree at the timeout."""
        return self._exec("EXEC", command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin)

    def _exec(
        self,
        operation: Operation,
        command: Sequence[str] | str,
        *,
        timeout_s: float,
        cwd: str,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        event_output: bytes | None = None,
        view: SandboxView | None = None,
        environment: dict[str, str] | None = None,
    ) -> ExecResult:
        started_ms = now_ms()
        cap = self._runtime.max_output_bytes
        captured: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        truncated: set[str] = set()
        stops_before = len(self._stops)
        with self._command(
            command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin, view=view, environment=environment
        ) as running:
            for stream, data in running.output():
                buffer = captured[stream]
                if len(buffer) + len(data) > cap:
                    truncated.add(stream)
                buffer += data[: max(cap - len(buffer), 0)]
            exit_code = running.finish()
        stdout, stderr = bytes(captured["stdout"]), bytes(captured["stderr"])
        for reason in self._stops[stops_before:]:
            stderr += f"\n[orchard: sandbox stopped: {reason}]\n".encode()
        result = ExecResult(
            exit_code=exit_code,
            stdout=_text(stdout, cap if "stdout" in truncated else None),
            stderr=_text(stderr, cap if "stderr" in truncated else None),
            duration_ms=running.duration_ms,
            timed_out=running.timed_out,
        )
        output = stdout + stderr if event_output is None else event_output
        record = OperationRecord.of_output(
            operation, _command_line(command), started_ms, result.duration_ms, output, exit_code
        )
        self._events.publish(record)
        return result

    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]]:
        """Run a command, yielding output chunks as they come and finally ``("exit", code)`` (``None``: killed by
        the timeout). Closing the iterator early kills the command."""
        started_ms = now_ms()
        stdout_digest, stderr_parts, size = hashlib.sha256(), bytearray(), 0
        running: RunningCommand | None = None
        exit_code: int | None = None
        try:
            with self._command(command, timeout_s=timeout_s, cwd=cwd, env=None, stdin=None) as running:
                for stream, data in running.output():
                    size += len(data)
                    if stream == "stdout":
                        stdout_digest.update(data)
                    else:
                        stderr_parts += data
                    yield stream, data
                exit_code = running.finish()
        finally:  # also when the caller abandons the stream (the command was killed): the event is still sent
            if running is not None:
                stdout_digest.update(stderr_parts)
                record = OperationRecord(
                    "EXEC",
                    _command_line(command),
                    started_ms,
                    running.duration_ms,
                    exit_code=exit_code,
                    output_sha256=stdout_digest.hexdigest() if size else "",
                    output_bytes=size,
                )
                self._events.publish(record)
        yield "exit", exit_code

    @contextlib.contextmanager
    def _command(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float,
        cwd: str,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        view: SandboxView | None = None,
        environment: dict[str, str] | None = None,
    ) -> Iterator[RunningCommand]:
        self._check_open()
        workdir = self.files.directory(cwd)
        seccomp = filter_fd() if self._isolation.namespaces else None
        try:
            running = RunningCommand(
                self._wrap(argv_of(command), self._inside(workdir), view=view, seccomp_fd=seccomp),
                env=environment if environment is not None else self._environment(self._inside(workdir), env),
                cwd=workdir,
                timeout_s=timeout_s,
                namespaced=self._isolation.namespaces,
                stdin=stdin,
                pass_fds=self._pass_fds(seccomp),
            )
        finally:
            if seccomp is not None:
                os.close(seccomp)
        self._track(running)
        try:
            yield running
        finally:
            running.kill()
            with self._lock:
                self._running.discard(running)

    def _wrap(
        self,
        argv: Sequence[str],
        workdir: str,
        *,
        pty: bool = False,
        view: SandboxView | None = None,
        seccomp_fd: int | None = None,
    ) -> list[str]:
        cgroup = self.resources.cgroup
        return self._isolation.command_argv(
            argv,
            cwd=workdir,
            limits=self.spec.limits,
            namespace_fds=self._namespace_fds or None,
            uid=self._owner[0] if self._owner is not None else None,
            view=view or self.view,
            seccomp_fd=seccomp_fd,
            cgroup_prefix=cgroup.join_argv() if cgroup is not None else (),
            whole_sandbox_memory=cgroup is not None,
            pty=pty,
        )

    def _pass_fds(self, seccomp_fd: int | None) -> list[int]:
        fds = list(self._namespace_fds.values())
        return fds if seccomp_fd is None else [*fds, seccomp_fd]

    def _environment(self, workdir: str, extra: Mapping[str, str] | None, term: str = "dumb") -> dict[str, str]:
        """A minimal environment: nothing of the host's; the spec's variables, then the call's."""
        env = minimal_environment(
            home=self.inside_home,
            tmp="/tmp" if self._isolation.namespaces else str(self.directory / "tmp"),  # noqa: S108 - private tmpfs
            workdir=workdir,
            ceiling=self._ceiling(),
            term=term,
        )
        env.update(self.spec.env)
        env.update(extra or {})
        return env

    def _track(self, item: RunningCommand | LocalPty) -> None:
        with self._lock:
            if self._closed:
                item.close()
                raise SandboxNotFoundError(f"sandbox {self.spec.sandbox_id!r} was deleted")
            self._running.add(item)

    def open_pty(self, command: Sequence[str] | str | None = None, *, cols: int = 80, rows: int = 24) -> PtySession:
        """Start ``command`` (default: an interactive shell) on a pseudo-terminal inside the sandbox."""
        self._check_open()
        argv = argv_of(command) if command is not None else [_login_shell(), "-i"]
        workdir = str(self.workdir)
        seccomp = filter_fd() if self._isolation.namespaces else None
        try:
            session = LocalPty(
                self._wrap(argv, self.inside_workdir, pty=True, seccomp_fd=seccomp),
                env=self._environment(self.inside_workdir, None, term="xterm-256color"),
                cwd=workdir,
                namespaced=self._isolation.namespaces,
                cols=cols,
                rows=rows,
                owner=self._owner,
                pass_fds=self._pass_fds(seccomp),
                on_close=self._pty_closed(_command_line(argv), now_ms()),
            )
        finally:
            if seccomp is not None:
                os.close(seccomp)
        self._track(session)
        return session

    def _pty_closed(self, command_line: str, started_ms: int) -> Callable[[LocalPty], None]:
        def publish(session: LocalPty) -> None:
            with self._lock:
                self._running.discard(session)
            code = session.wait(0)
            digest = session.output_digest.hexdigest() if session.output_bytes else ""
            record = OperationRecord(
                "EXEC",
                f"pty: {command_line}",
                started_ms,
                session.duration_ms,
                exit_code=code,
                output_sha256=digest,
                output_bytes=session.output_bytes,
            )
            self._events.publish(record)

        return publish

    # -- files --------------------------------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file (parents created)."""
        self._file_op("WRITE_FILE", path, lambda: self.files.write(path, data, mode), output=data)

    def read_file(self, path: str) -> bytes:
        """A file's content."""
        return self._file_op("READ_FILE", path, lambda: self.files.read(path))

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path`` (paths relative to the working copy)."""
        return self._file_op("LIST_FILES", path, lambda: self.files.list(path, recursive))

    def delete_file(self, path: str) -> None:
        """Remove a file or directory tree."""
        self._file_op("DELETE_FILE", path, lambda: self.files.delete(path))

    def _file_op(self, operation: Operation, path: str, action: Callable[[], T], *, output: bytes = b"") -> T:
        self._check_open()
        started_ms, started = now_ms(), time.perf_counter()
        result = action()
        if isinstance(result, bytes):
            output = result
        duration_ms = (time.perf_counter() - started) * 1000.0
        self._events.publish(OperationRecord.of_output(operation, path, started_ms, duration_ms, output))
        return result

    def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff (``a/``/``b/`` prefixes) to the working copy with ``git apply``, inside the sandbox
        (so its paths get the same confinement as any command). The event's digest is of the patch text."""
        tool = ["git", "apply", "--verbose", "--whitespace=nowarn", "-"] if shutil.which("git") else ["patch", "-p1"]
        data = patch.encode()
        return self._exec(
            "APPLY_PATCH", tool, timeout_s=PATCH_TIMEOUT_S, cwd=".", env=None, stdin=data, event_output=data
        )

    # -- grading ------------------------------------------------------------------------------------------------

    def run_grader(self, files: Mapping[str, bytes], command: str, *, timeout_s: float) -> GraderRun:
        """Run a grading command over the working copy with the grader out of the agent's reach.

        Every process of the sandbox is killed first. The grader's ``files`` go into a fresh root-owned, read-only
        directory outside the working copy (``$ORCHARD_GRADER_DIR``); the command gets a fresh output directory
        (``$ORCHARD_GRADER_OUT``, whose files come back in ``GraderRun.outputs``), a fresh ``$HOME`` and ``/tmp``,
        and an environment of its own (nothing of the spec's, the harness's or the host's). With namespaces it sees
        none of the agent's files but the working copy: not its home, not its temporary files."""
        self._check_open()
        self.terminate_all()
        with contextlib.suppress(SandboxError):
            self.files.delete(LEGACY_SIGNALS_FILE)  # never read, but no agent-written file may look like an output
        runtime = self._runtime
        with grader_directories(
            runtime.root, self.spec.sandbox_id, files, owner=self._owner, scratch=runtime.scratch
        ) as (grader, out, home):
            namespaced = self._isolation.namespaces
            grader_dir, out_dir = (GRADER_DIR, GRADER_OUT) if namespaced else (str(grader), str(out))
            environment = self._grader_environment(home, grader_dir, out_dir)
            view = self.view.for_grader(self.workdir, home, grader, out) if namespaced else None
            self._grading = True
            try:
                result = self._exec(
                    "EXEC", command, timeout_s=timeout_s, cwd=".", env=None, stdin=None, view=view,
                    environment=environment,
                )  # fmt: skip
            finally:
                self._grading = False
            return GraderRun(result=result, outputs=read_grader_outputs(out))

    def _ceiling(self) -> str:
        return INSIDE_ROOT if self._isolation.namespaces else str(self.directory)

    def _grader_environment(self, home: Path, grader_dir: str, out_dir: str) -> dict[str, str]:
        namespaced = self._isolation.namespaces
        env = minimal_environment(
            home=self.inside_home if namespaced else str(home),
            tmp="/tmp" if namespaced else str(home),  # noqa: S108 - the grader's own fresh tmpfs
            workdir=self.inside_workdir,
            ceiling=self._ceiling(),
        )
        return {**env, "ORCHARD_GRADER_DIR": grader_dir, "ORCHARD_GRADER_OUT": out_dir}

    # -- lifetime -----------------------------------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Push the TTL deadline to ``ttl_s`` from now."""
        self._check_open()
        self.deadline = time.monotonic() + self.spec.ttl_s

    def info(self) -> SandboxInfo:
        """Spec, lifetime, paths and endpoint."""
        return SandboxInfo(
            spec=self.spec,
            created_at=self.created_at,
            expires_at=time.time() + (self.deadline - time.monotonic()),
            workdir=self.inside_workdir,
            proxy_endpoint=self.proxy_endpoint,
            isolation=self._isolation.describe(),
        )

    def close(self) -> None:
        """Kill everything running, close the network door, delete the files, free the uid (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
        for item in running:
            item.close()
        self._runtime.provisioner.release(self.resources)
        self._runtime._forget(self.spec.sandbox_id)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxNotFoundError(f"sandbox {self.spec.sandbox_id!r} was deleted")


def _command_line(command: Sequence[str] | str) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def _text(data: bytes, truncated_at: int | None) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if truncated_at is None else text + f"\n[orchard: output truncated at {truncated_at} bytes]"


def _login_shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def minimal_environment(*, home: str, tmp: str, workdir: str, ceiling: str, term: str = "dumb") -> dict[str, str]:
    """What every command of a sandbox, the grader's included, starts with: nothing of the host's."""
    return {
        "PATH": SYSTEM_PATH,
        "HOME": home,
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "TERM": term,
        "TMPDIR": tmp,
        "PWD": workdir,
        "GIT_CEILING_DIRECTORIES": ceiling,  # git never finds a repository above the sandbox
    }
