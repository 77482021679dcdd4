"""The ``local`` runtime: each sandbox is a working copy on this machine, and its commands are process trees
isolated as ``orchard.sandbox.local.isolation`` describes (namespaces, own uid, rlimits, minimal environment).

Layout under the runtime's root (mode 0711, so sandboxes cannot list it)::

    <root>/<sandbox_id>/        mode 0700, owned by the sandbox's uid; inside a sandbox only its three parts exist
        work/                   the working copy (``spec.source_dir`` copied without .git); commands start here
        home/                   $HOME
        tmp/                    /tmp and /var/tmp inside (with namespaces), $TMPDIR without
        grader/, grader-out/, grader-home/
                                made only for ``run_grader``, after every agent process is dead (grader/: root's)

What a command sees of the machine is an allow-list (``orchard.sandbox.local.sandbox_view``); the sandbox's memory,
processes and CPU are limited as a whole by its cgroup (``orchard.sandbox.local.cgroups``), its disk and CPU seconds by
the watchdog (``orchard.sandbox.local.watchdog``), and its system calls by the seccomp filter
(``orchard.sandbox.local.seccomp``).

Network: in a new network namespace only ``lo`` exists. When ``spec.proxy_url`` is set, the runtime listens on the
sandbox's own ``127.0.0.1:<proxy port>`` and relays each connection to the proxy
(``orchard.sandbox.local.proxy_bridge``): the proxy is the one endpoint the sandbox reaches, at
``SandboxInfo.proxy_endpoint``. Without namespaces the sandbox shares the host network (a warning says so at start).

Every exec and file operation is published as a ``SandboxEvent`` when a bus producer is given. A sandbox lives
until ``delete``/``close``, or until ``reap_expired`` finds its TTL lapsed (``ttl_s`` after creation or the last
``heartbeat``; other operations do not extend it). Processes never outlive the ``exec`` that started them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import resource
import secrets
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from orchard.bus import Producer
from orchard.clock import now_ms
from orchard.logging import get_logger
from orchard.sandbox import (
    ExecResult,
    FileEntry,
    GraderRun,
    PtySession,
    Runtime,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
)
from orchard.sandbox.events import Operation, OperationRecord, SandboxEventPublisher
from orchard.sandbox.exceptions import (
    InvalidSandboxRequestError,
    SandboxError,
    SandboxExistsError,
    SandboxNotFoundError,
    SandboxStartError,
)
from orchard.sandbox.local.cgroups import CgroupSupport, detect_cgroups
from orchard.sandbox.local.interpreter import interpreter_paths
from orchard.sandbox.local.isolation import SYSTEM_PATH, Isolation, IsolationMode, detect_isolation
from orchard.sandbox.local.mounts import detach_stale, mount_scratch, unmount
from orchard.sandbox.local.process import RunningCommand
from orchard.sandbox.local.provisioning import Provisioner, SandboxResources, remove_tree
from orchard.sandbox.local.proxy_bridge import ProxyBridge
from orchard.sandbox.local.pty_session import LocalPty
from orchard.sandbox.local.sandbox_view import (
    GRADER_DIR,
    GRADER_OUT,
    INSIDE_HOME,
    INSIDE_ROOT,
    INSIDE_WORK,
    TOP_LEVEL_SYSTEM,
    SandboxView,
    stage_etc,
)
from orchard.sandbox.local.seccomp import filter_fd, sandbox_filter_bpf
from orchard.sandbox.local.uids import UidAllocator, kill_processes_of
from orchard.sandbox.local.watchdog import Watchdog, Watched
from orchard.sandbox.safe_fs import ConfinedDirectory

MIB = 1024 * 1024
PATCH_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 16 * MIB
SANDBOX_USER = "sandbox"
LEGACY_SIGNALS_FILE = ".orchard-signals.json"
GRADER_SCRATCH_MB = 64
"""Room for what a grader writes (outputs, home), beyond its own files."""
MAX_GRADER_OUTPUT_BYTES = 4 * MIB
"""What ``run_grader`` reads back of each file the grader wrote (its signals are a few hundred bytes)."""

T = TypeVar("T")
log = get_logger("orchard.sandbox.local.runtime")


class LocalRuntime(Runtime):
    """Sandboxes as isolated process trees in working copies under ``root``."""

    def __init__(
        self,
        root: Path,
        bus_producer: Producer | None = None,
        *,
        isolation: IsolationMode = "auto",
        git_snapshot: bool = False,
        allowed_sources: Sequence[Path] | None = None,
        hidden_paths: Sequence[Path] = (),
        shared_paths: Sequence[Path] = (),
        share_interpreter: bool = True,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        uid_allocator: UidAllocator | None = None,
    ) -> None:
        """Create ``root`` if needed, detect the isolation and cgroups this machine allows (once per process), and
        raise this process's soft limit of open files to its hard limit (each sandbox holds a few descriptors).

        ``git_snapshot``: make each working copy a fresh one-commit git repository. ``allowed_sources``: when set,
        ``spec.source_dir`` must lie under one of these directories. ``shared_paths``: host directories sandboxes see
        read-only at their own paths (harness installations); nothing else of the host exists inside a namespaced
        sandbox but the minimal system (``orchard.sandbox.local.sandbox_view``). ``share_interpreter``: also share what
        this process's Python needs to run inside sandboxes (its installation, virtualenv and the ``orchard`` package,
        ``orchard.sandbox.local.interpreter``), so Python harnesses run with ``sys.executable``. ``hidden_paths``: host
        directories that must stay invisible (the bus, the store, task directories): a shared path that would show one
        is refused at start. ``max_output_bytes``: ``exec`` keeps at most this much of each of stdout and stderr
        (``exec_stream`` passes everything on).
        """
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # noqa: S103 - traverse only: sandboxes cannot list it
        self.isolation: Isolation = detect_isolation(isolation)
        self.cgroups: CgroupSupport = detect_cgroups() if self.isolation.drop_uid else CgroupSupport(None, "no uid")
        if self.isolation.namespaces:
            sandbox_filter_bpf()  # fail at start, not at the first command, when libseccomp is missing
        self.producer = bus_producer
        self.allowed_sources = [Path(p).resolve() for p in allowed_sources] if allowed_sources is not None else None
        self.max_output_bytes = max_output_bytes
        uids = (uid_allocator or UidAllocator()) if self.isolation.drop_uid else None
        self.bridge = ProxyBridge()
        hidden = tuple(Path(p).resolve() for p in hidden_paths)
        shared = [Path(p).resolve() for p in shared_paths]
        if share_interpreter and self.isolation.namespaces:
            shared += interpreter_paths()
        self.shared = tuple(_outermost(p for p in shared if not _in_system(p)))
        self._check_shares(hidden)
        self.etc = (
            stage_etc(self.root / f".etc-{os.getpid()}-{secrets.token_hex(4)}") if self.isolation.namespaces else None
        )
        self.scratch = os.geteuid() == 0
        self._root_lock = _lock_root(self.root) if self.scratch else None
        self.provisioner = Provisioner(
            self.root, self.isolation, uids, self.bridge, self.cgroups, git_snapshot, scratch=self.scratch
        )
        self._producer_lock = threading.Lock()
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        _raise_open_files_limit()
        self.watchdog = Watchdog(self._busy)
        if self.cgroups.version is None:
            log.warning(
                "sandbox_cgroups_unavailable", reason=self.cgroups.reason,
                effect="memory, processes and CPU are limited per process (rlimits), not per sandbox",
            )  # fmt: skip
        log.info(
            "local_runtime_started",
            root=str(self.root),
            isolation=self.isolation.describe(),
            cgroups=self.cgroups.describe(),
            shared=[str(p) for p in self.shared],
        )

    def _check_shares(self, hidden: tuple[Path, ...]) -> None:
        """A shared directory must not hold the runtime's root (every sandbox's files) or a hidden path."""
        for path in self.shared:
            for secret in (self.root, *hidden):
                if secret.is_relative_to(path):
                    raise ValueError(f"shared path {path} would show {secret} to every sandbox")

    def _busy(self) -> list[Watched]:
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        return [sandbox.watched for sandbox in sandboxes if sandbox.busy]

    def create(self, spec: SandboxSpec) -> LocalSandbox:
        """Create and start a sandbox; it is ready for ``exec`` on return."""
        self._check_source(spec)
        with self._lock:
            if spec.sandbox_id in self._sandboxes or spec.sandbox_id in self._reserved:
                raise SandboxExistsError(f"sandbox {spec.sandbox_id!r} already exists")
            self._reserved.add(spec.sandbox_id)
        try:
            sandbox = self._build(spec)
            with self._lock:
                self._sandboxes[spec.sandbox_id] = sandbox
        finally:
            with self._lock:
                self._reserved.discard(spec.sandbox_id)
        return sandbox

    def _build(self, spec: SandboxSpec) -> LocalSandbox:
        started = time.perf_counter()
        resources = self.provisioner.provision(spec)
        sandbox = LocalSandbox(self, spec, resources)
        log.info("sandbox_created", sandbox=spec.sandbox_id, ms=round((time.perf_counter() - started) * 1000, 2))
        return sandbox

    def _check_source(self, spec: SandboxSpec) -> None:
        if spec.source_dir is None or self.allowed_sources is None:
            return
        source = Path(spec.source_dir).resolve()
        if not any(source.is_relative_to(allowed) for allowed in self.allowed_sources):
            raise InvalidSandboxRequestError(f"source_dir {spec.source_dir} is not under an allowed source directory")

    def get(self, sandbox_id: str) -> LocalSandbox:
        """A live sandbox by id (``SandboxNotFoundError``, a ``KeyError``, if unknown)."""
        with self._lock:
            sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            raise SandboxNotFoundError(f"no sandbox {sandbox_id!r}")
        return sandbox

    def list(self) -> list[Sandbox]:
        """Live sandboxes, by id."""
        with self._lock:
            return [self._sandboxes[key] for key in sorted(self._sandboxes)]

    def delete(self, sandbox_id: str) -> None:
        """Close and forget a sandbox (no error if already gone)."""
        with self._lock:
            sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            sandbox.close()

    def reap_expired(self) -> list[str]:
        """Delete sandboxes whose TTL lapsed; return their ids."""
        now = time.monotonic()
        with self._lock:
            expired = [key for key, sandbox in self._sandboxes.items() if sandbox.deadline <= now]
        for sandbox_id in expired:
            log.info("sandbox_reaped", sandbox=sandbox_id)
            self.delete(sandbox_id)
        return expired

    def close(self) -> None:
        """Delete every sandbox, stop the watchdog and the proxy relay."""
        super().close()
        self.watchdog.close()
        self.bridge.close()
        if self.etc is not None:
            shutil.rmtree(self.etc, ignore_errors=True)
        if self._root_lock is not None:
            os.close(self._root_lock)
            self._root_lock = None

    def _forget(self, sandbox_id: str) -> None:
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)


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
                self._wrap(_argv(command), self._inside(workdir), view=view, seccomp_fd=seccomp),
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
        tmp = "/tmp" if self._isolation.namespaces else str(self.directory / "tmp")  # noqa: S108 - private tmpfs
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": self.inside_home,
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
            "SHELL": "/bin/sh",
            "LANG": "C.UTF-8",
            "TERM": term,
            "TMPDIR": tmp,
            "PWD": workdir,
            "GIT_CEILING_DIRECTORIES": self._ceiling(),  # git never finds a repository above the sandbox
        }
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
        argv = _argv(command) if command is not None else [_login_shell(), "-i"]
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
        # Outside the sandbox's own files (which the agent may have filled to the last byte and inode), on a tmpfs
        # of its own where the runtime is root: the grader's writes cannot reach the host's disk either.
        base = self._runtime.root / f".grader-{self.spec.sandbox_id}-{secrets.token_hex(4)}"
        base.mkdir(mode=0o755)
        mounted = False
        try:
            if self._runtime.scratch:
                size_mb = sum(len(data) for data in files.values()) // MIB + GRADER_SCRATCH_MB
                mount_scratch(base, size_mb, None, mode=0o755)
                mounted = True
            return self._grade_in(base, files, command, timeout_s)
        finally:
            if mounted:
                unmount(base)
            remove_tree(base)

    def _grade_in(self, base: Path, files: Mapping[str, bytes], command: str, timeout_s: float) -> GraderRun:
        grader, out, home = base / "grader", base / "out", base / "home"
        write_grader_files(grader, files)
        for directory in (out, home):
            directory.mkdir(mode=0o700)
            if self._owner is not None:
                os.chown(directory, *self._owner)
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
        tmp = "/tmp" if self._isolation.namespaces else str(home)  # noqa: S108 - the grader's own fresh tmpfs
        return {
            "PATH": SYSTEM_PATH,
            "HOME": self.inside_home if self._isolation.namespaces else str(home),
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
            "SHELL": "/bin/sh",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": tmp,
            "PWD": self.inside_workdir,
            "GIT_CEILING_DIRECTORIES": self._ceiling(),
            "ORCHARD_GRADER_DIR": grader_dir,
            "ORCHARD_GRADER_OUT": out_dir,
        }

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


def write_grader_files(directory: Path, files: Mapping[str, bytes]) -> None:
    """The grader's files in a new directory owned by root (directories 0755, files 0644: readable, not writable,
    by the sandbox's uid); a path that leaves the directory is refused."""
    directory.mkdir(mode=0o755)
    for relative, data in files.items():
        path = (directory / relative).resolve()
        if not path.is_relative_to(directory.resolve()) or path == directory.resolve():
            raise InvalidSandboxRequestError(f"grader file {relative!r} leaves the grader's directory")
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o644)


def read_grader_outputs(directory: Path, max_files: int = 64) -> dict[str, bytes]:
    """The regular files the grader left at the top of ``directory`` (symbolic links, devices, FIFOs and
    subdirectories ignored), by name, each cut at ``MAX_GRADER_OUTPUT_BYTES``."""
    outputs: dict[str, bytes] = {}
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if len(outputs) >= max_files:
                break
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    outputs[entry.name] = handle.read(MAX_GRADER_OUTPUT_BYTES)
    return outputs


def _outermost(paths: Iterable[Path]) -> list[Path]:
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != other and p.is_relative_to(other) for other in unique)]


def _in_system(path: Path) -> bool:
    """Whether the minimal system view already shows ``path`` (``/usr/...`` and the links into it)."""
    return any(path.is_relative_to(Path("/") / name) for name in TOP_LEVEL_SYSTEM)


def _argv(command: Sequence[str] | str) -> list[str]:
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    if not command:
        raise InvalidSandboxRequestError("empty command")
    return list(command)


def _command_line(command: Sequence[str] | str) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def _text(data: bytes, truncated_at: int | None) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if truncated_at is None else text + f"\n[orchard: output truncated at {truncated_at} bytes]"


def _login_shell() -> str:
    return "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"


def _lock_root(root: Path) -> int:
    """Share the runtime root with every other live runtime there (a shared ``flock``); the first one in, holding
    it alone for a moment, first detaches the sandbox mounts a crashed runtime left behind."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # flock on the directory itself
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    else:
        stale = detach_stale(root)
        if stale:
            log.warning("sandbox_stale_mounts_detached", count=len(stale), root=str(root))
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _raise_open_files_limit() -> None:
    """Each sandbox holds a few descriptors (namespaces, uid lease): raise the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
