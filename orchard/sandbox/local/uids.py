"""Per-sandbox user ids, leased machine-wide so no two live sandboxes ever share one.

With its own uid a sandbox cannot read another's files (its directory is mode 0700) and RLIMIT_NPROC becomes a
limit on that sandbox's processes. A lease is an exclusive ``flock`` on ``<lock_dir>/<uid>.lock``: it is shared by
every runtime on the machine (several test processes, a benchmark beside a server), and it is released by the
kernel if the process holding it dies, so nothing leaks. A process a crashed runtime left behind may still run as
a freed uid, so ``acquire`` kills any process of the uid it hands out before anything of the new sandbox exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import threading
from dataclasses import dataclass
from pathlib import Path

from orchard.sandbox.exceptions import SandboxStartError

DEFAULT_UID_BASE = 1_900_000_000
DEFAULT_UID_COUNT = 65_536
DEFAULT_LOCK_DIR = Path("/run/orchard-sandbox-uids")


@dataclass(frozen=True)
class UidLease:
    """One uid (also used as the gid) held until ``UidAllocator.release``."""

    uid: int
    fd: int


class UidAllocator:
    """Hands out uids from ``[base, base + count)`` that no other live sandbox on this machine holds."""

    def __init__(self, lock_dir: Path = DEFAULT_LOCK_DIR, base: int = DEFAULT_UID_BASE, count: int = DEFAULT_UID_COUNT):
        """The lock directory is created (mode 0700) if missing."""
        self.lock_dir, self.base, self.count = lock_dir, base, count
        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._cursor = random.randrange(count)  # noqa: S311 - spreads processes over the range, not a secret
        self._lock = threading.Lock()

    def acquire(self) -> UidLease:
        """Lease a free uid; ``SandboxStartError`` when all are taken."""
        with self._lock:
            for step in range(self.count):
                slot = (self._cursor + step) % self.count
                lease = self._try(self.base + slot)
                if lease is not None:
                    self._cursor = (slot + 1) % self.count
                    kill_processes_of(lease.uid)
                    return lease
        raise SandboxStartError(f"all {self.count} sandbox uids from {self.base} are in use")

    def release(self, lease: UidLease) -> None:
        """Give the uid back (the lock file stays, for the next lease)."""
        os.close(lease.fd)

    def _try(self, uid: int) -> UidLease | None:
        fd = os.open(self.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return UidLease(uid, fd)


def kill_processes_of(uid: int) -> list[int]:
    """SIGKILL every process whose effective uid is ``uid`` (``/proc/<pid>`` is owned by it); return their pids."""
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if entry.stat().st_uid == uid:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
