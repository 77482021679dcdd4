"""Making and unmaking what one local sandbox holds: a uid lease, its directories and working copy, its cgroup, its
namespaces and its one network door (to the proxy). Each step is undone, in reverse, when a later one fails.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from orchard.sandbox import SandboxSpec
from orchard.sandbox.exceptions import InvalidSandboxRequestError, SandboxExistsError, SandboxStartError
from orchard.sandbox.local.cgroups import CgroupSupport, SandboxCgroup
from orchard.sandbox.local.isolation import SYSTEM_PATH, Isolation
from orchard.sandbox.local.mounts import mount_scratch, unmount
from orchard.sandbox.local.netns import listen_loopback, loopback_up, run_in_netns
from orchard.sandbox.local.process import spawn
from orchard.sandbox.local.proxy_bridge import BridgeListener, ProxyBridge
from orchard.sandbox.local.uids import UidAllocator, UidLease
from orchard.sandbox.workspace import chown_tree, copy_source, git_snapshot

MIB = 1024 * 1024
HOLDER_READY_TIMEOUT_S = 15.0


@dataclass
class SandboxResources:
    """Everything a live local sandbox holds; ``Provisioner.release`` gives it all back."""

    directory: Path
    owner: tuple[int, int] | None = None
    lease: UidLease | None = None
    namespace_fds: dict[str, int] = field(default_factory=dict)
    listener: BridgeListener | None = None
    proxy_endpoint: str | None = None
    cgroup: SandboxCgroup | None = None
    made_directory: bool = False
    scratch: bool = False
    """The directory is a tmpfs of ``disk_mb`` (``orchard.sandbox.local.mounts``)."""

    @property
    def workdir(self) -> Path:
        """The working copy."""
        return self.directory / "work"

    @property
    def home(self) -> Path:
        """``$HOME`` of the agent's commands."""
        return self.directory / "home"

    @property
    def tmp(self) -> Path:
        """The sandbox's temporary directory (``/tmp`` inside)."""
        return self.directory / "tmp"

    @property
    def shm(self) -> Path:
        """The sandbox's shared memory (``/dev/shm`` inside)."""
        return self.directory / "shm"


@dataclass(frozen=True)
class Provisioner:
    """Provisions sandboxes under ``root`` with the machine's isolation."""

    root: Path
    isolation: Isolation
    uids: UidAllocator | None
    bridge: ProxyBridge
    cgroups: CgroupSupport
    git_snapshot: bool = False
    scratch: bool = False
    """Give each sandbox a tmpfs of ``disk_mb`` (needs root)."""

    def provision(self, spec: SandboxSpec) -> SandboxResources:
        """Lease a uid, copy the working copy, make the cgroup, create namespaces, open the door to the proxy."""
        resources = SandboxResources(self.root / spec.sandbox_id)
        try:
            if self.uids is not None:
                resources.lease = self.uids.acquire()
                resources.owner = (resources.lease.uid, resources.lease.uid)
            self._make_directories(spec, resources)
            if self.cgroups.version is not None:
                limits = spec.limits
                resources.cgroup = SandboxCgroup.create(
                    self.cgroups, spec.sandbox_id, memory_mb=limits.memory_mb, processes=limits.processes,
                    cpus=limits.cpus,
                )  # fmt: skip
            if self.isolation.holds_namespaces:
                resources.namespace_fds = self._start_namespaces()
            resources.proxy_endpoint = self._open_network(spec, resources)
        except BaseException:
            self.release(resources)
            raise
        return resources

    def release(self, resources: SandboxResources) -> None:
        """Close the door, drop the namespaces, delete the files, free the uid (what exists of them)."""
        if resources.listener is not None:
            self.bridge.stop(resources.listener)
            resources.listener = None
        for fd in resources.namespace_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        resources.namespace_fds = {}
        if resources.cgroup is not None:
            resources.cgroup.remove()
            resources.cgroup = None
        if resources.scratch:
            unmount(resources.directory)
            resources.scratch = False
        if resources.made_directory:
            remove_tree(resources.directory)
            resources.made_directory = False
        if resources.lease is not None and self.uids is not None:
            self.uids.release(resources.lease)
            resources.lease = None

    def _make_directories(self, spec: SandboxSpec, resources: SandboxResources) -> None:
        directory = resources.directory
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            raise SandboxExistsError(f"directory {directory} already exists") from None
        resources.made_directory = True
        if self.scratch:
            mount_scratch(directory, spec.limits.disk_mb, resources.owner)
            resources.scratch = True
        for sub in (resources.workdir, resources.home, resources.tmp, resources.shm):
            sub.mkdir(mode=0o755)
        for shared_dir in (resources.tmp, resources.shm):
            os.chmod(shared_dir, 0o1777)  # noqa: S103 - the sandbox's own /tmp and /dev/shm: sticky, as always
        if spec.source_dir is not None:
            copy_source(Path(spec.source_dir), resources.workdir, max_bytes=spec.limits.disk_mb * MIB)
            if self.git_snapshot if spec.git_snapshot is None else spec.git_snapshot:
                git_snapshot(resources.workdir)
        if resources.owner is not None:
            chown_tree(directory, *resources.owner)

    def _start_namespaces(self) -> dict[str, int]:
        """Run the holder; keep its namespaces open by descriptor; let it exit."""
        argv = self.isolation.holder_argv()
        pipe = subprocess.PIPE
        holder = spawn(argv, env={"PATH": SYSTEM_PATH}, cwd="/", stdin=pipe, stdout=pipe, stderr=pipe)
        fds: dict[str, int] = {}
        try:
            _wait_ready(holder)
            for name in self.isolation.namespace_names:
                fds[name] = os.open(f"/proc/{holder.pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            for fd in fds.values():
                os.close(fd)
            raise
        finally:
            for stream in (holder.stdin, holder.stdout, holder.stderr):
                if stream is not None:
                    stream.close()
            try:
                holder.wait(timeout=HOLDER_READY_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.wait()
        return fds

    def _open_network(self, spec: SandboxSpec, resources: SandboxResources) -> str | None:
        """Bring up the sandbox's loopback and its door to the proxy; return the proxy URL as seen inside."""
        proxy_url = spec.proxy_url
        if not self.isolation.namespaces:
            return proxy_url
        if self.isolation.mode != "root":
            if proxy_url is not None:
                raise InvalidSandboxRequestError("proxy_url needs the 'root' isolation mode (the runtime as root)")
            return None
        netns = resources.namespace_fds["net"]
        if proxy_url is None:
            run_in_netns(netns, loopback_up)
            return None
        parts = urlsplit(proxy_url)
        if parts.hostname is None:
            raise InvalidSandboxRequestError(f"proxy_url {proxy_url!r} has no host")
        port = parts.port or (443 if parts.scheme == "https" else 80)

        def listen() -> socket.socket:
            loopback_up()
            return listen_loopback(port)

        sock = run_in_netns(netns, listen)
        resources.listener = self.bridge.serve(sock, (parts.hostname, port), spec.sandbox_id)
        return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def _wait_ready(holder: subprocess.Popen[bytes]) -> None:
    if holder.stdout is None or holder.stderr is None:
        raise SandboxStartError("the holder was started without pipes")
    with selectors.DefaultSelector() as selector:
        selector.register(holder.stdout, selectors.EVENT_READ)
        if selector.select(HOLDER_READY_TIMEOUT_S) and holder.stdout.readline() == b"ready\n":
            return
    holder.kill()
    holder.wait()
    error = holder.stderr.read().decode(errors="replace").strip()
    raise SandboxStartError(f"sandbox namespaces could not be set up: {error or 'no answer from the holder'}")


def remove_tree(path: Path) -> None:
    """Delete a sandbox directory even where the sandbox removed its own write permissions."""

    def make_writable(function: object, failed: str, exc_info: object) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(failed)
            if not os.path.islink(parent):
                os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if path.exists():
        shutil.rmtree(path, onerror=make_writable)
