"""Inter-process locks on files (``flock``): released by the kernel when a holder dies, even by ``kill -9``."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchard.bus.embedded.frames import write_pieces


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the duration of the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


@contextmanager
def try_file_lock(path: Path, *, blocking: bool) -> Iterator[bool]:
    """Like ``file_lock``, but without ``blocking`` give up at once if another holder has it: yield whether held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes | list[bytes], *, fsync: bool) -> None:
    """Replace ``path`` with ``data`` (or its pieces, in order) so that readers see the old or the new content,
    never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_pieces(fd, [data] if isinstance(data, bytes) else data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
