"""Limits for a sandbox as a whole: memory, process count and CPU through a control group per sandbox.

Two layouts are supported, detected once per process (``detect_cgroups``):

- **v1** (these machines): the ``memory``, ``pids``, ``cpu`` and ``cpuacct`` hierarchies mounted under
  ``/sys/fs/cgroup/<controller>/``; each sandbox gets ``orchard/<name>`` in every one of them.
- **v2**: one unified hierarchy at ``/sys/fs/cgroup`` whose ``cgroup.subtree_control`` can enable ``memory``,
  ``pids`` and ``cpu`` for ``orchard/``.

Where neither works (not root, a read-only or controller-less mount), ``detect_cgroups`` says why and the runtime
keeps only the per-process rlimits (it logs a warning at start). Every command of a sandbox joins its group before
anything of the command runs (``join_argv``: a ``/bin/sh`` that writes its own pid to each ``cgroup.procs``, then
``exec``\\ s the rest), so everything the command forks is counted, daemonised or not.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchard.logging import get_logger

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PARENT = "orchard"
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuacct")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
EMPTY_WAIT_S = 5.0
JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
"""Joins every ``cgroup.procs`` file named before ``--``, then becomes the command (exit 125: could not join)."""

log = get_logger("orchard.sandbox.local.cgroups")


@dataclass(frozen=True)
class CgroupSupport:
    """Which cgroup layout this machine lets the runtime use (``None``: none, with the reason)."""

    version: Literal[1, 2] | None
    reason: str = ""

    def describe(self) -> str:
        """A few words for logs and ``SandboxInfo.isolation``."""
        return f"cgroup v{self.version} memory+pids+cpu" if self.version else "no cgroups"


@functools.cache
def detect_cgroups() -> CgroupSupport:
    """The cgroup layout to use, probed once per process by creating and removing a test group."""
    if os.geteuid() != 0:
        return CgroupSupport(None, "not running as root")
    v1 = [CGROUP_ROOT / name for name in V1_CONTROLLERS]
    if all((path / "cgroup.procs").exists() for path in v1):
        reason = _probe([path / GROUP_PARENT for path in v1])
        return CgroupSupport(1) if reason is None else CgroupSupport(None, f"cgroup v1: {reason}")
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        reason = _enable_v2()
        return CgroupSupport(2) if reason is None else CgroupSupport(None, f"cgroup v2: {reason}")
    return CgroupSupport(None, f"no usable cgroup hierarchy under {CGROUP_ROOT}")


def _probe(parents: list[Path]) -> str | None:
    name = f"probe-{secrets.token_hex(4)}"
    try:
        for parent in parents:
            (parent / name).mkdir(parents=True)
    except OSError as exc:
        return str(exc)
    finally:
        for parent in parents:
            with contextlib.suppress(OSError):
                (parent / name).rmdir()
    return None


def _enable_v2() -> str | None:
    available = (CGROUP_ROOT / "cgroup.controllers").read_text().split()
    missing = [name for name in V2_CONTROLLERS if name not in available]
    if missing:
        return f"controllers not available: {', '.join(missing)}"
    parent = CGROUP_ROOT / GROUP_PARENT
    try:
        parent.mkdir(exist_ok=True)
        wanted = " ".join(f"+{name}" for name in V2_CONTROLLERS)
        (CGROUP_ROOT / "cgroup.subtree_control").write_text(wanted)
        (parent / "cgroup.subtree_control").write_text(wanted)
    except OSError as exc:
        return str(exc)
    return None


@dataclass
class SandboxCgroup:
    """One sandbox's control group (in each v1 hierarchy, or one v2 group)."""

    version: Literal[1, 2]
    name: str

    @classmethod
    def create(
        cls, support: CgroupSupport, sandbox_id: str, *, memory_mb: int, processes: int, cpus: float
    ) -> SandboxCgroup:
        """Make the group with its limits; the name carries a random suffix (two runtimes may reuse an id)."""
        if support.version is None:
            raise ValueError(f"cgroups are not usable here: {support.reason}")
        group = cls(support.version, f"{sandbox_id}-{secrets.token_hex(4)}")
        try:
            for directory in group.directories:
                directory.mkdir(parents=True)
            group._limit(memory_mb, processes, cpus)
        except BaseException:
            group.remove()
            raise
        return group

    @property
    def directories(self) -> list[Path]:
        """The group's directory in each hierarchy."""
        if self.version == 1:
            return [CGROUP_ROOT / name / GROUP_PARENT / self.name for name in V1_CONTROLLERS]
        return [CGROUP_ROOT / GROUP_PARENT / self.name]

    def _file(self, controller: str, name: str) -> Path:
        if self.version == 1:
            return CGROUP_ROOT / controller / GROUP_PARENT / self.name / name
        return CGROUP_ROOT / GROUP_PARENT / self.name / name

    def _limit(self, memory_mb: int, processes: int, cpus: float) -> None:
        memory, quota = str(memory_mb * 1024 * 1024), str(max(int(cpus * CPU_PERIOD_US), 1000))
        if self.version == 1:
            self._file("memory", "memory.limit_in_bytes").write_text(memory)
            swap = self._file("memory", "memory.memsw.limit_in_bytes")
            if swap.exists():
                swap.write_text(memory)
            self._file("pids", "pids.max").write_text(str(processes))
            self._file("cpu", "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            self._file("cpu", "cpu.cfs_quota_us").write_text(quota)
            return
        self._file("memory", "memory.max").write_text(memory)
        swap = self._file("memory", "memory.swap.max")
        if swap.exists():
            swap.write_text("0")
        self._file("pids", "pids.max").write_text(str(processes))
        self._file("cpu", "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")

    def join_argv(self) -> list[str]:
        """The prefix that puts a command (and all it forks) into this group before it runs."""
        procs = [str(directory / "cgroup.procs") for directory in self.directories]
        return ["/bin/sh", "-c", JOIN_SCRIPT, "orchard-cgroup", *procs, "--"]

    def cpu_seconds(self) -> float:
        """CPU time used by every process that ever ran in the group, seconds."""
        try:
            if self.version == 1:
                return int(self._file("cpuacct", "cpuacct.usage").read_text()) / 1e9
            for line in self._file("cpu", "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return 0.0

    def pids(self) -> list[int]:
        """Processes now in the group."""
        try:
            text = self._file("pids", "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def kill_all(self) -> bool:
        """SIGKILL every process in the group until it is empty (a fork between two reads is caught by the next
        round); whether it emptied within ``EMPTY_WAIT_S``."""
        kill_file = self._file("pids", "cgroup.kill")
        deadline = time.monotonic() + EMPTY_WAIT_S
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return True
            if self.version == 2 and kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)
        return not self.pids()

    def remove(self) -> None:
        """Kill what is left and delete the group from every hierarchy."""
        self.kill_all()
        for directory in self.directories:
            for _ in range(50):  # rmdir fails while the last killed process is still being torn down
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
            else:
                log.warning("cgroup_not_removed", group=str(directory))
