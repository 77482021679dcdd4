"""The ``local`` runtime: each sandbox is a working copy on this machine, and its commands are process trees
isolated as ``orchard.env.isolation`` describes (namespaces, own uid, rlimits, minimal environment).

Layout under the runtime's root (mode 0711, so sandboxes cannot list it)::

    <root>/<sandbox_id>/        mode 0700, owned by the sandbox's uid
        work/                   the working copy (``spec.source_dir`` copied without .git); commands start here
        home/                   $HOME
        tmp/                    $TMPDIR when there are no namespaces (otherwise /tmp is a private tmpfs)

Network: in a new network namespace only ``lo`` exists. When ``spec.proxy_url`` is set, the runtime listens on the
sandbox's own ``127.0.0.1:<proxy port>`` and relays each connection to the proxy (``orchard.env.proxy_bridge``):
the proxy is the one endpoint the sandbox reaches, at ``SandboxInfo.proxy_endpoint``. Without namespaces the
sandbox shares the host network (a warning says so at start).

Every exec and file operation is published as a ``SandboxEvent`` when a bus producer is given. A sandbox lives
until ``delete``/``close``, or until ``reap_expired`` finds its TTL lapsed (``ttl_s`` after creation or the last
``heartbeat``; other operations do not extend it). Processes never outlive the ``exec`` that started them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from orchard.bus import Producer
from orchard.clock import now_ms
from orchard.env.events import Operation, OperationRecord, SandboxEventPublisher
from orchard.env.exceptions import InvalidSandboxRequestError, SandboxExistsError, SandboxNotFoundError
from orchard.env.interpreter import interpreter_paths
from orchard.env.isolation import (
    SYSTEM_PATH,
    Isolation,
    IsolationMode,
    detect_isolation,
    reachable_unchanged,
    traversal_masks,
)
from orchard.env.process import RunningCommand
from orchard.env.provisioning import Provisioner, SandboxResources
from orchard.env.proxy_bridge import ProxyBridge
from orchard.env.pty_session import LocalPty
from orchard.env.runtime import ExecResult, FileEntry, PtySession, Runtime, Sandbox, SandboxInfo, SandboxSpec
from orchard.env.safe_fs import ConfinedDirectory
from orchard.env.uids import UidAllocator
from orchard.logging import get_logger

MIB = 1024 * 1024
PATCH_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT_BYTES = 16 * MIB
SANDBOX_USER = "sandbox"

T = TypeVar("T")
log = get_logger("orchard.env.local_runtime")


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
        """Create ``root`` if needed, detect the isolation this machine allows (once per process), and raise this
        process's soft limit of open files to its hard limit (each sandbox holds a few descriptors).

        ``git_snapshot``: make each working copy a fresh one-commit git repository. ``allowed_sources``: when set,
        ``spec.source_dir`` must lie under one of these directories. ``hidden_paths``: host directories sandboxes
        see empty (with namespaces) — whatever world-readable data they must not read, such as the bus and store
        directories, task sources, hidden tests. ``shared_paths``: host directories sandboxes see read-only at
        their own paths even inside a private or hidden directory (harness installations).
        ``share_interpreter``: also share what this process's Python needs to run inside sandboxes (its
        installation, virtualenv and the ``orchard`` package, ``orchard.env.interpreter``), so Python harnesses run
        with ``sys.executable``; only the paths a sandbox could not otherwise reach are shared, and an untraversable
        directory above them (``/root``) is masked so nothing else in it shows. ``max_output_bytes``: ``exec``
        keeps at most this much of each of stdout and stderr (``exec_stream`` passes everything on).
        """
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # noqa: S103 - traverse only: sandboxes cannot list it
        self.isolation: Isolation = detect_isolation(isolation)
        self.producer = bus_producer
        self.allowed_sources = [Path(p).resolve() for p in allowed_sources] if allowed_sources is not None else None
        self.max_output_bytes = max_output_bytes
        uids = (uid_allocator or UidAllocator()) if self.isolation.drop_uid else None
        self.bridge = ProxyBridge()
        hidden = tuple(Path(p).resolve() for p in hidden_paths)
        if hidden and not self.isolation.namespaces:
            log.warning("sandbox_hidden_paths_not_hidden", paths=[str(p) for p in hidden], reason="no namespaces")
        shared = tuple(Path(p).resolve() for p in shared_paths)
        if any(":" in str(p) for p in shared):
            raise ValueError(f"shared paths may not contain ':': {[str(p) for p in shared]}")
        if share_interpreter and self.isolation.namespaces:
            shared += tuple(self._interpreter_shares(shared, hidden))
        masks = tuple(traversal_masks(shared)) if self.isolation.mode == "root" else ()
        self.provisioner = Provisioner(
            self.root, self.isolation, uids, self.bridge, git_snapshot, hidden, shared, masks
        )
        self._producer_lock = threading.Lock()
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        _raise_open_files_limit()
        log.info(
            "local_runtime_started",
            root=str(self.root),
            isolation=self.isolation.describe(),
            shared=[str(p) for p in shared],
            masked=[str(p) for p in masks],
        )

    def _interpreter_shares(self, shared: tuple[Path, ...], hidden: tuple[Path, ...]) -> list[Path]:
        """This interpreter's directories that sandboxes would not otherwise see (and no shared path covers)."""
        wanted = []
        for path in interpreter_paths():
            if any(path.is_relative_to(p) for p in shared) or reachable_unchanged(path, root=self.root, hidden=hidden):
                continue
            if ":" in str(path):
                log.warning("sandbox_interpreter_not_shared", path=str(path), reason="':' in the path")
                continue
            wanted.append(path)
        return wanted

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
        """Delete every sandbox and stop the proxy relay."""
        super().close()
        self.bridge.close()

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
    ) -> ExecResult:
        started_ms = now_ms()
        cap = self._runtime.max_output_bytes
        captured: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        truncated: set[str] = set()
        with self._command(command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin) as running:
            for stream, data in running.output():
                buffer = captured[stream]
                if len(buffer) + len(data) > cap:
                    truncated.add(stream)
                buffer += data[: max(cap - len(buffer), 0)]
            exit_code = running.finish()
        stdout, stderr = bytes(captured["stdout"]), bytes(captured["stderr"])
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
    ) -> Iterator[RunningCommand]:
        self._check_open()
        workdir = self.files.directory(cwd)
        argv = self._wrap(_argv(command), workdir)
        running = RunningCommand(
            argv,
            env=self._environment(workdir, env),
            cwd=workdir,
            timeout_s=timeout_s,
            namespaced=self._isolation.namespaces,
            stdin=stdin,
            pass_fds=list(self._namespace_fds.values()),
        )
        self._track(running)
        try:
            yield running
        finally:
            running.kill()
            with self._lock:
                self._running.discard(running)

    def _wrap(self, argv: Sequence[str], workdir: str, *, pty: bool = False) -> list[str]:
        return self._isolation.command_argv(
            argv,
            cwd=workdir,
            limits=self.spec.limits,
            namespace_fds=self._namespace_fds or None,
            uid=self._owner[0] if self._owner is not None else None,
            pty=pty,
        )

    def _environment(self, workdir: str, extra: Mapping[str, str] | None, term: str = "dumb") -> dict[str, str]:
        """A minimal environment: nothing of the host's; the spec's variables, then the call's."""
        tmp = "/tmp" if self._isolation.namespaces else str(self.directory / "tmp")  # noqa: S108 - private tmpfs
        env = {
            "PATH": SYSTEM_PATH,
            "HOME": str(self.directory / "home"),
            "USER": SANDBOX_USER,
            "LOGNAME": SANDBOX_USER,
            "SHELL": "/bin/sh",
            "LANG": "C.UTF-8",
            "TERM": term,
            "TMPDIR": tmp,
            "PWD": workdir,
            "GIT_CEILING_DIRECTORIES": str(self.directory),  # git never finds a repository above the sandbox
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
        session = LocalPty(
            self._wrap(argv, workdir, pty=True),
            env=self._environment(workdir, None, term="xterm-256color"),
            cwd=workdir,
            namespaced=self._isolation.namespaces,
            cols=cols,
            rows=rows,
            owner=self._owner,
            pass_fds=list(self._namespace_fds.values()),
            on_close=self._pty_closed(_command_line(argv), now_ms()),
        )
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
            workdir=str(self.workdir),
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


def _raise_open_files_limit() -> None:
    """Each sandbox holds a few descriptors (namespaces, uid lease): raise the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
