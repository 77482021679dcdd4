"""The runtime interface: a runtime creates sandboxes (one per episode); a sandbox runs commands and holds files.

Two runtimes implement it: ``local`` (a process tree in its own working copy and namespaces, the default) and
``kubernetes`` (one Pod per episode). The sandbox REST API and the episode service use only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SANDBOX_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


class Limits(BaseModel):
    """Resource limits of one sandbox (rlimits locally, requests/limits on Kubernetes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu_seconds: int = Field(600, ge=1, description="CPU time of the whole process tree, seconds (RLIMIT_CPU).")
    cpus: float = Field(1.0, gt=0, description="CPU cores (Kubernetes limit).")
    memory_mb: int = Field(2048, ge=16, description="Address space / memory limit, MiB.")
    open_files: int = Field(1024, ge=16, description="Open file descriptors per process (RLIMIT_NOFILE).")
    processes: int = Field(256, ge=4, description="Processes of the sandbox user (RLIMIT_NPROC).")
    file_size_mb: int = Field(1024, ge=1, description="Largest file a process may write, MiB (RLIMIT_FSIZE).")
    disk_mb: int = Field(4096, ge=16, description="Working copy size limit, MiB (ephemeral storage on Kubernetes).")


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
