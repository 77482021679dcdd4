"""The ``local`` runtime: each sandbox is a working copy on this machine, and its commands are process trees
isolated as ``orchard.sandbox.local.isolation`` describes (namespaces, own uid, rlimits, minimal environment).
``LocalRuntime`` makes, finds and reaps them (``orchard.sandbox.local.provisioning`` does the making); each is a
``LocalSandbox`` (``orchard.sandbox.local.sandbox``).

Layout under the runtime's root (mode 0711, so sandboxes cannot list it)::

    <root>/<sandbox_id>/        mode 0700, owned by the sandbox's uid; inside a sandbox only its three parts exist
        work/                   the working copy (``spec.source_dir`` copied without .git); commands start here
        home/                   $HOME
        tmp/                    /tmp and /var/tmp inside (with namespaces), $TMPDIR without
    <root>/.grader-<sandbox_id>-<random>/
        grader/, out/, home/    made only for ``run_grader``, after every agent process is dead (grader/: root's;
                                ``orchard.sandbox.local.grading``)

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
import os
import resource
import secrets
import shutil
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from orchard.bus import Producer
from orchard.logging import get_logger
from orchard.sandbox import Runtime, Sandbox, SandboxSpec
from orchard.sandbox.exceptions import InvalidSandboxRequestError, SandboxExistsError, SandboxNotFoundError
from orchard.sandbox.local.cgroups import CgroupSupport, detect_cgroups
from orchard.sandbox.local.interpreter import interpreter_paths
from orchard.sandbox.local.isolation import Isolation, IsolationMode, detect_isolation
from orchard.sandbox.local.mounts import detach_stale
from orchard.sandbox.local.provisioning import Provisioner
from orchard.sandbox.local.proxy_bridge import ProxyBridge
from orchard.sandbox.local.sandbox import LocalSandbox
from orchard.sandbox.local.sandbox_view import TOP_LEVEL_SYSTEM, stage_etc
from orchard.sandbox.local.seccomp import sandbox_filter_bpf
from orchard.sandbox.local.uids import UidAllocator
from orchard.sandbox.local.watchdog import Watchdog, Watched

__all__ = ["DEFAULT_MAX_OUTPUT_BYTES", "LocalRuntime", "LocalSandbox"]

MIB = 1024 * 1024
DEFAULT_MAX_OUTPUT_BYTES = 16 * MIB
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


def _outermost(paths: Iterable[Path]) -> list[Path]:
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != other and p.is_relative_to(other) for other in unique)]


def _in_system(path: Path) -> bool:
    """Whether the minimal system view already shows ``path`` (``/usr/...`` and the links into it)."""
    return any(path.is_relative_to(Path("/") / name) for name in TOP_LEVEL_SYSTEM)


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
