"""The sandbox interface: a runtime creates sandboxes (one per episode); a sandbox runs commands and holds files.

Two runtimes implement it: ``local`` (``orchard.sandbox.local``: a process tree in its own working copy and namespaces,
the default) and ``kubernetes`` (``orchard.sandbox.kubernetes``: one Pod per episode). The sandbox REST API, the
episode service (``orchard.env``) and the harness adapters (``orchard.harnesses``) use only this interface; it sits
below both, so the harnesses import nothing of ``orchard.env`` nor of the runtimes.
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.sandbox.exceptions import InvalidSandboxRequestError

MAX_MIB = 64 * 1024 * 1024
"""The largest size limit accepted, MiB (64 TiB: past it, rlimit arithmetic overflows and the kernel refuses)."""
SANDBOX_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class Limits(BaseModel):
    """Resource limits of one sandbox. The local runtime enforces them for the sandbox as a whole where it can use
    cgroups (memory, processes, CPU) and its disk watcher (``disk_mb``, CPU seconds), and per process with rlimits
    everywhere; the Kubernetes runtime maps them onto the pod (see the README's "What each runtime enforces")."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int = Field(
        600,
        ge=1,
        le=10_000_000,
        description="CPU time of the whole sandbox, seconds (cgroup accounting; also each process's RLIMIT_CPU).",
    )
    cpus: float = Field(
        1.0, gt=0, le=1024, description="CPU cores of the whole sandbox (cgroup CPU quota; Kubernetes limit)."
    )
    memory_mb: int = Field(
        2048,
        ge=16,
        le=MAX_MIB,
        description="Memory of the whole sandbox, MiB (cgroup limit; pod memory limit). Without cgroups, "
        "each process's address space.",
    )
    address_space_mb: int | None = Field(
        None,
        ge=16,
        le=MAX_MIB,
        description="Address space of each process, MiB (RLIMIT_AS); None: unlimited where a cgroup "
        "limits memory (Chromium and V8 reserve a terabyte they never touch), else memory_mb.",
    )
    open_files: int = Field(1024, ge=16, le=1_048_576, description="Open file descriptors per process (RLIMIT_NOFILE).")
    processes: int = Field(
        256,
        ge=4,
        le=4_194_304,
        description="Processes of the whole sandbox (pids cgroup; also RLIMIT_NPROC of its own uid).",
    )
    file_size_mb: int = Field(
        1024, ge=1, le=MAX_MIB, description="Largest file a process may write, MiB (RLIMIT_FSIZE)."
    )
    disk_mb: int = Field(
        4096,
        ge=16,
        le=MAX_MIB,
        description="Working copy, home and temporary files together, MiB: checked at copy-in and "
        "enforced while commands run (ephemeral storage on Kubernetes).",
    )


class SandboxSpec(BaseModel):
    """What to create: identity, the task's files (a directory) or image, limits, lifetime, network."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox_id: str = Field(pattern=SANDBOX_ID_PATTERN, description="DNS-label-safe id, unique per runtime.")
    run_id: str
    episode_id: str
    task_id: str
    source_dir: Path | None = Field(None, description="Task directory copied into the sandbox's working copy.")
    image: str | None = Field(None, description="Container image (Kubernetes runtime).")
    git_snapshot: bool | None = Field(
        None, description="Make the working copy a one-commit git repository (None: the runtime's default)."
    )
    limits: Limits = Field(default_factory=Limits)
    ttl_s: float = Field(3600.0, gt=0, description="Reaped this long after the last heartbeat.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of every command.")
    proxy_url: str | None = Field(None, description="The one network endpoint the sandbox may reach.")
    labels: dict[str, str] = Field(default_factory=dict)


class ExecResult(BaseModel):
    """How a command ended."""

    model_config = ConfigDict(frozen=True)

    exit_code: int | None = Field(description="Exit status; None when killed by the timeout.")
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool = False


class GraderRun(BaseModel):
    """How a grading command ended, and the files it left in its output directory (by name)."""

    model_config = ConfigDict(frozen=True)

    result: ExecResult
    outputs: dict[str, bytes] = Field(default_factory=dict)


class FileEntry(BaseModel):
    """One entry of a directory listing inside a sandbox."""

    model_config = ConfigDict(frozen=True)

    path: str
    kind: Literal["file", "dir", "link", "other"]
    size: int


class SandboxInfo(BaseModel):
    """What a client needs to know about a live sandbox besides its spec."""

    model_config = ConfigDict(frozen=True)

    spec: SandboxSpec
    created_at: float | None = Field(None, description="Creation time, seconds since the Unix epoch.")
    expires_at: float | None = Field(None, description="When it is reaped unless heartbeated, Unix epoch seconds.")
    workdir: str | None = Field(None, description="Path of the working copy as processes inside the sandbox see it.")
    proxy_endpoint: str | None = Field(
        None, description="URL that reaches ``spec.proxy_url`` from inside the sandbox (may differ from it)."
    )
    isolation: str | None = Field(None, description="How the backend isolates it, in a few words.")


def argv_of(command: Sequence[str] | str) -> list[str]:
    """A command as every runtime runs it: a string through ``/bin/sh -c``, a sequence as the argv itself (an empty
    one is an ``InvalidSandboxRequestError``: there is nothing to run).

    >>> argv_of("echo hi")
    ['/bin/sh', '-c', 'echo hi']
    >>> argv_of(("ls", "-l"))
    ['ls', '-l']
    """
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    if not command:
        raise InvalidSandboxRequestError("empty command")
    return list(command)


class PtySession(ABC):
    """An interactive process on a pseudo-terminal inside a sandbox: bytes in, bytes out, resizable."""

    @abstractmethod
    def read(self, max_bytes: int = 65536, timeout_s: float = 1.0) -> bytes | None:
        """Output bytes; ``None`` when nothing came within ``timeout_s``; ``b""`` once the terminal closed."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send input (keystrokes) to the process."""

    @abstractmethod
    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""

    @abstractmethod
    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit status once the process ended (``None`` if still running after ``timeout_s``)."""

    @abstractmethod
    def close(self) -> None:
        """Kill the process tree and release the terminal."""


class Sandbox(ABC):
    """One isolated environment; paths are relative to its working copy and may not escape it."""

    spec: SandboxSpec

    @abstractmethod
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

    @abstractmethod
    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]]:
        """Run a command, yielding output chunks as they come and finally ``("exit", code)``."""

    @abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file (parents created)."""

    @abstractmethod
    def read_file(self, path: str) -> bytes:
        """A file's content."""

    @abstractmethod
    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under ``path``."""

    @abstractmethod
    def delete_file(self, path: str) -> None:
        """Remove a file or directory tree."""

    @abstractmethod
    def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff to the working copy."""

    @abstractmethod
    def heartbeat(self) -> None:
        """Push the TTL deadline forward."""

    @abstractmethod
    def close(self) -> None:
        """Kill everything running and delete the sandbox."""

    def run_grader(self, files: Mapping[str, bytes], command: str, *, timeout_s: float) -> GraderRun:
        """Run a grading command over the working copy once the agent is done, with the grader out of its reach.

        ``files`` (relative paths) are placed in a fresh directory outside the working copy, named to the command
        by ``$ORCHARD_GRADER_DIR``; the command writes its outputs into the fresh ``$ORCHARD_GRADER_OUT``, whose
        files come back in ``GraderRun.outputs``. It runs through ``/bin/sh -c`` in the working copy.

        This default works on any backend through ``exec`` only (a directory with a random name under ``/tmp``,
        and only ``signals.json`` read back); it cannot stop processes the agent left running. Backends that can
        do better override it (the local runtime: every agent process killed first, the grader read-only in an
        otherwise fresh view, a clean environment)."""
        base = f"/tmp/orchard-grader-{secrets.token_hex(12)}"  # noqa: S108 - unguessable, made after the agent
        grader_dir, out_dir = f"{base}/grader", f"{base}/out"
        self.exec(["/bin/sh", "-c", 'umask 077; mkdir -p "$1" "$2"', "orchard-grader", grader_dir, out_dir])
        for relative, data in sorted(files.items()):
            path = f"{grader_dir}/{relative}"
            script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
            self.exec(["/bin/sh", "-c", script, "orchard-grader", path], stdin=data)
        env = {"ORCHARD_GRADER_DIR": grader_dir, "ORCHARD_GRADER_OUT": out_dir}
        result = self.exec(command, timeout_s=timeout_s, env=env)
        signals = self.exec(["/bin/sh", "-c", 'cat "$1" 2>/dev/null', "orchard-grader", f"{out_dir}/signals.json"])
        outputs = {"signals.json": signals.stdout.encode()} if signals.exit_code == 0 else {}
        self.exec(["rm", "-rf", base])
        return GraderRun(result=result, outputs=outputs)

    def info(self) -> SandboxInfo:
        """The spec plus lifetime and endpoints (backends fill in what they know)."""
        return SandboxInfo(spec=self.spec)

    def open_pty(self, command: Sequence[str] | str | None = None, *, cols: int = 80, rows: int = 24) -> PtySession:
        """Start ``command`` (default: an interactive shell) on a pseudo-terminal."""
        raise NotImplementedError(f"{type(self).__name__} has no PTY support")


class Runtime(ABC):
    """Creates, finds and reaps sandboxes."""

    @abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox:
        """Create and start a sandbox; it is ready for ``exec`` on return."""

    @abstractmethod
    def get(self, sandbox_id: str) -> Sandbox:
        """A live sandbox by id (``KeyError`` if unknown)."""

    @abstractmethod
    def list(self) -> list[Sandbox]:
        """Live sandboxes."""

    @abstractmethod
    def delete(self, sandbox_id: str) -> None:
        """Close and forget a sandbox (no error if already gone)."""

    @abstractmethod
    def reap_expired(self) -> list[str]:
        """Delete sandboxes whose TTL lapsed; return their ids."""

    def close(self) -> None:
        """Delete every live sandbox (backends release their own resources too)."""
        for sandbox in self.list():
            self.delete(sandbox.spec.sandbox_id)
