"""A sandbox's files on a size-capped tmpfs of their own: ``disk_mb`` enforced by the kernel, not by a watcher.

As root, the local runtime mounts a tmpfs of ``disk_mb`` (and at most ``MAX_INODES`` files) on each sandbox's
directory before anything is copied in, so the working copy, ``$HOME`` and ``/tmp`` together can never grow past
the limit: a write beyond it fails with ``ENOSPC``, and the host's disk is never touched. Pages an agent writes there
are charged to its cgroup's memory, like any tmpfs. Mounts a crashed runtime left behind under its root are
detached the next time a runtime starts there (``detach_stale``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

MNT_DETACH = 2
MS_NOSUID = 2
MS_NODEV = 4
MAX_INODES = 200_000
"""Files (and directories) a sandbox may hold: a million empty files would exhaust inodes without using bytes."""

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mount_scratch(directory: Path, size_mb: int, owner: tuple[int, int] | None, mode: int = 0o700) -> None:
    """Mount a tmpfs of ``size_mb`` MiB on ``directory`` (``mode``, owned by ``owner`` or root); ``OSError`` if
    refused."""
    options = f"size={size_mb}m,nr_inodes={MAX_INODES},mode={mode:o}"
    if owner is not None:
        options += f",uid={owner[0]},gid={owner[1]}"
    result = _libc.mount(b"orchard-sandbox", str(directory).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode())
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {directory}: {os.strerror(err)}")


def unmount(directory: Path) -> None:
    """Detach the mount on ``directory`` (lazily: a process still holding a file there keeps only that file)."""
    if _libc.umount2(str(directory).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {directory}: {os.strerror(err)}")


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root`` (from ``/proc/self/mountinfo``), deepest first."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = Path(line.split()[4].encode().decode("unicode_escape"))
            if point.is_relative_to(root):
                found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def detach_stale(root: Path) -> list[Path]:
    """Detach every mount under ``root`` (sandboxes of a runtime that died without cleaning up)."""
    detached = []
    for point in mounts_under(root):
        if point != root:
            try:
                unmount(point)
            except OSError:
                continue
            detached.append(point)
    return detached
