"""The local runtime's watchdog: limits that no rlimit can express, enforced while a sandbox's commands run.

Every ``INTERVAL_S`` it looks at each sandbox with a command running and stops all of them when

- its cgroup has used more than ``cpu_seconds`` of CPU (every process together, not one at a time), or
- where the sandbox's files are not on a tmpfs of their own (``orchard.sandbox.local.mounts``: a runtime that is not
  root), they take more than ``disk_mb`` or hold more than ``MAX_ENTRIES`` entries. That check bounds how far past
  ``disk_mb`` a sandbox gets to about one interval of writing; the tmpfs makes it exact.

The command that was stopped reports why on its stderr.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from orchard.logging import get_logger

INTERVAL_S = 0.5
MAX_ENTRIES = 200_000
BLOCK = 512
MIB = 1024 * 1024

log = get_logger("orchard.sandbox.local.watchdog")


@dataclass(frozen=True)
class Watched:
    """What the watchdog needs of one sandbox: its directories, limits, CPU meter and how to stop it."""

    name: str
    directories: tuple[Path, ...]
    disk_mb: int | None
    """``None``: the kernel enforces it (the sandbox's files are on a tmpfs of that size)."""
    cpu_seconds: int
    cpu_used: Callable[[], float] | None
    stop: Callable[[str], None]


def disk_usage(directories: Iterable[Path], max_entries: int = MAX_ENTRIES) -> tuple[int, int]:
    """Bytes allocated under ``directories`` and how many entries they hold (symbolic links not followed; the walk
    stops once ``max_entries`` is passed).

    >>> import tempfile; d = Path(tempfile.mkdtemp()); _ = (d / "a").write_bytes(b"x" * 10000)
    >>> size, entries = disk_usage([d]); size >= 10000, entries
    (True, 1)
    """
    total, entries = 0, 0
    stack = [str(path) for path in directories]
    while stack and entries <= max_entries:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as listing:
            for entry in listing:
                entries += 1
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * BLOCK
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total, entries


def over_limit(sandbox: Watched) -> str | None:
    """Why ``sandbox`` must be stopped now, or ``None``."""
    if sandbox.cpu_used is not None:
        used = sandbox.cpu_used()
        if used > sandbox.cpu_seconds:
            return f"cpu_seconds limit reached ({used:.1f} s of {sandbox.cpu_seconds} s for the whole sandbox)"
    if sandbox.disk_mb is None:
        return None
    size, entries = disk_usage(sandbox.directories)
    if entries > MAX_ENTRIES:
        return f"disk limit reached (more than {MAX_ENTRIES} files)"
    if size > sandbox.disk_mb * MIB:
        return f"disk_mb limit reached ({size // MIB} MiB of {sandbox.disk_mb} MiB)"
    return None


class Watchdog:
    """A daemon thread checking ``busy()``'s sandboxes every ``interval_s``; ``close`` stops it."""

    def __init__(self, busy: Callable[[], list[Watched]], interval_s: float = INTERVAL_S) -> None:
        """Start watching."""
        self._busy, self._interval = busy, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="orchard-sandbox-watchdog", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            for sandbox in self._busy():
                try:
                    reason = over_limit(sandbox)
                    if reason is not None:
                        log.warning("sandbox_limit_exceeded", sandbox=sandbox.name, reason=reason)
                        sandbox.stop(reason)
                except Exception as exc:  # noqa: BLE001 - one sandbox's failure must not end the watch of all
                    log.error("sandbox_watch_failed", sandbox=sandbox.name, error=repr(exc))

    def close(self) -> None:
        """Stop the thread."""
        self._stop.set()
        self._thread.join(timeout=5.0)
