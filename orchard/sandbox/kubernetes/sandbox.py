"""One episode pod as a ``Sandbox``: every command and file operation is an exec in its container of a command from
``orchard.sandbox.kubernetes.commands`` (through ``KubernetesRuntime.stream_exec``), a terminal an exec with ``tty``
(``orchard.sandbox.kubernetes.streams``), a heartbeat a patch of the pod's expiry annotation."""

from __future__ import annotations

import io
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from orchard.sandbox import ExecResult, FileEntry, PtySession, Sandbox, SandboxInfo, SandboxSpec, argv_of
from orchard.sandbox.exceptions import InvalidSandboxRequestError, SandboxFileNotFoundError, SandboxStartError
from orchard.sandbox.kubernetes.commands import (
    DELETE_SCRIPT,
    EXIT_IS_DIR,
    EXIT_MISSING,
    PATCH_SCRIPT,
    PTY_SCRIPT,
    READ_SCRIPT,
    WRITE_SCRIPT,
    exec_argv,
    host_exec_env,
    list_script,
    parse_listing,
    workspace_path,
)
from orchard.sandbox.kubernetes.errors import KubernetesRuntimeError
from orchard.sandbox.kubernetes.objects import pod_name
from orchard.sandbox.kubernetes.streams import KubernetesPtySession, StreamEvent
from orchard.sandbox.workspace import GIT_IDENTITY

if TYPE_CHECKING:
    from orchard.sandbox.kubernetes.runtime import KubernetesRuntime


class KubernetesSandbox(Sandbox):
    """One episode pod; every operation is an exec in its container (see ``orchard.sandbox.kubernetes.commands``)."""

    def __init__(
        self,
        runtime: KubernetesRuntime,
        spec: SandboxSpec,
        *,
        created_at: float | None = None,
        expires_at: float | None = None,
    ) -> None:
        self.spec = spec
        self.pod_name = pod_name(spec.sandbox_id, runtime.config)
        self.created_at = created_at
        self.expires_at = expires_at
        self._runtime = runtime
        self._workspace = runtime.workspace_of(spec.sandbox_id)

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 60.0,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run a command and wait for it; the node kills its process group at the timeout."""
        started = time.perf_counter()
        out, err, code = self._collect(self._events(command, timeout_s, cwd, env, stdin))
        return ExecResult(
            exit_code=code,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            duration_ms=(time.perf_counter() - started) * 1000,
            timed_out=code is None,
        )

    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[StreamEvent]:
        """Run a command, yielding output chunks as they arrive and finally ``("exit", code or None)``."""
        return self._events(command, timeout_s, cwd, None, None)

    def open_pty(self, command: Sequence[str] | str | None = None, *, cols: int = 80, rows: int = 24) -> PtySession:
        """Start ``command`` (default ``/bin/sh``) on a terminal in the pod, in the working copy."""
        argv = ["/bin/sh"] if command is None else argv_of(command)
        env = host_exec_env(self.spec, self._workspace) if self._runtime.config.node_exec_root is not None else {}
        env["TERM"] = "xterm-256color"
        pairs = [f"{key}={value}" for key, value in env.items()]
        full = ["/bin/sh", "-c", PTY_SCRIPT, "orchard-pty", self._workspace, str(len(pairs)), *pairs, *argv]
        session = KubernetesPtySession(self._runtime.open_stream(self.pod_name, full, tty=True))
        session.resize(cols, rows)
        return session

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a file (parents created) through ``cat`` with the content on stdin."""
        target = workspace_path(self._workspace, path)
        self._file_op(["/bin/sh", "-c", WRITE_SCRIPT, "sh", target, format(mode, "o")], path, stdin=data)

    def read_file(self, path: str) -> bytes:
        """A file's content through ``cat``."""
        return self._file_op(["/bin/sh", "-c", READ_SCRIPT, "sh", workspace_path(self._workspace, path)], path)

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under a directory (or the one entry of a file) through GNU ``find -printf``, sorted by path."""
        argv = ["/bin/sh", "-c", list_script(recursive), "sh", workspace_path(self._workspace, path)]
        return parse_listing(self._file_op(argv, path), path)

    def delete_file(self, path: str) -> None:
        """Remove a file or directory tree (``rm -rf``); the working copy's root itself is refused."""
        target = workspace_path(self._workspace, path)
        if target == self._workspace:
            raise InvalidSandboxRequestError("cannot delete the working copy itself")
        self._file_op(["/bin/sh", "-c", DELETE_SCRIPT, "sh", target], path)

    def apply_patch(self, patch: str) -> ExecResult:
        """Apply a unified diff in the working copy with ``git apply`` (or ``patch -p1`` where git is missing)."""
        return self.exec(
            ["/bin/sh", "-c", PATCH_SCRIPT], timeout_s=self._runtime.config.file_op_timeout_s, stdin=patch.encode()
        )

    def upload_dir(self, source: Path) -> None:
        """Copy a local directory's contents into the working copy (a tar stream into ``tar -x``)."""
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                # No version-control history goes in: reading future commits is a known reward hack.
                tar.add(source, arcname=".", filter=lambda info: None if _is_vcs_path(info.name) else info)
            size = archive.tell()
            archive.seek(0)
            argv = ["tar", "-x", "-f", "-", "-C", self._workspace]
            self._file_op(argv, str(source), stdin=archive, stdin_len=size)

    def git_snapshot(self) -> None:
        """Make the working copy a new git repository whose single commit is its content (the image needs git)."""
        done = self.exec(
            ["/bin/sh", "-c", "git init -q && git add -A && git commit -q --allow-empty --no-verify -m task"],
            timeout_s=self._runtime.config.file_op_timeout_s,
            env={**GIT_IDENTITY, "HOME": self._workspace},
        )
        if done.exit_code != 0:
            raise SandboxStartError(f"git snapshot of the working copy failed: {(done.stderr or done.stdout)[-500:]}")

    def heartbeat(self) -> None:
        """Push the ``orchard.dev/expires-at`` annotation ``ttl_s`` past now."""
        self.expires_at = self._runtime.extend(self.spec.sandbox_id, self.spec.ttl_s)

    def info(self) -> SandboxInfo:
        """The spec, lifetime and working directory as this object last saw them."""
        config = self._runtime.config
        isolation = f"Kubernetes pod {config.namespace}/{self.pod_name}, egress to the proxy only"
        if config.runtime_class_name:
            isolation += f", runtime class {config.runtime_class_name}"
        return SandboxInfo(
            spec=self.spec,
            created_at=self.created_at,
            expires_at=self.expires_at,
            workdir=self._workspace,
            proxy_endpoint=self.spec.proxy_url,
            isolation=isolation,
        )

    def close(self) -> None:
        """Delete the pod (and its Secret and policy)."""
        self._runtime.delete(self.spec.sandbox_id)

    def _file_op(
        self, argv: list[str], path: str, *, stdin: bytes | IO[bytes] | None = None, stdin_len: int | None = None
    ) -> bytes:
        timeout = self._runtime.config.file_op_timeout_s
        out, err, code = self._collect(self._events(argv, timeout, ".", None, stdin, stdin_len))
        if code == EXIT_MISSING:
            raise SandboxFileNotFoundError(f"no file or directory {path!r}")
        if code == EXIT_IS_DIR:
            raise InvalidSandboxRequestError(f"{path!r} is a directory")
        if code != 0:
            reason = "timed out" if code is None else f"exit {code}"
            raise KubernetesRuntimeError(f"{argv[0]} on {path!r} in {self.pod_name} failed ({reason}): {err[-500:]!r}")
        return out

    def _events(
        self,
        command: Sequence[str] | str,
        timeout_s: float,
        cwd: str,
        env: Mapping[str, str] | None,
        stdin: bytes | IO[bytes] | None,
        stdin_len: int | None = None,
    ) -> Iterator[StreamEvent]:
        if isinstance(stdin, bytes):
            stdin, stdin_len = io.BytesIO(stdin), len(stdin)
        if self._runtime.config.node_exec_root is not None:
            # A host-exec node applies none of the pod's environment: every command carries it instead.
            env = {**host_exec_env(self.spec, self._workspace), **(env or {})}
        argv = exec_argv(
            command,
            cwd=workspace_path(self._workspace, cwd),
            timeout_s=timeout_s,
            env=env or {},
            stdin_len=stdin_len if stdin is not None else None,
        )
        return self._runtime.stream_exec(self.pod_name, argv, stdin, timeout_s)

    @staticmethod
    def _collect(events: Iterator[StreamEvent]) -> tuple[bytes, bytes, int | None]:
        out, err, code = bytearray(), bytearray(), None
        for kind, value in events:
            if kind == "stdout" and isinstance(value, bytes):
                out += value
            elif kind == "stderr" and isinstance(value, bytes):
                err += value
            elif kind == "exit":
                code = value if isinstance(value, int) else None
        return bytes(out), bytes(err), code


def _is_vcs_path(name: str) -> bool:
    """Whether an archive member belongs to version-control metadata (``.git``, ``.hg``, ``.svn``)."""
    return any(part in {".git", ".hg", ".svn"} for part in name.split("/"))
