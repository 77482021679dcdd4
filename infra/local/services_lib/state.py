"""State of the local services: one directory per service name under ``services_root()`` (``state.json`` with its
kind and ports, data, logs, pid files), a per-process re-entrant lock on it, and ``ServiceError``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]

_LOCK_DEPTH: dict[Path, tuple[int, int]] = {}  # lock path -> (fd, depth): service_lock is re-entrant per process


class ServiceError(RuntimeError):
    """A local service could not be fetched, started, found or stopped."""


def services_root() -> Path:
    """The directory holding one state directory per service name."""
    return Path(os.environ.get("ORCHARD_SERVICES_DIR") or REPO_ROOT / ".orchard" / "services")


def service_dir(name: str) -> Path:
    """The state directory of the service called ``name``."""
    if not name or "/" in name or name.startswith("."):
        raise ServiceError(f"invalid service name {name!r}")
    return services_root() / name


@contextlib.contextmanager
def service_lock(name: str) -> Iterator[Path]:
    """Hold an exclusive, per-process re-entrant file lock on the service ``name``; yields its state directory."""
    directory = service_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".lock"
    fd, depth = _LOCK_DEPTH.get(path, (-1, 0))
    if depth == 0:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    _LOCK_DEPTH[path] = (fd, depth + 1)
    try:
        yield directory
    finally:
        fd, depth = _LOCK_DEPTH.pop(path)
        if depth > 1:
            _LOCK_DEPTH[path] = (fd, depth - 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((directory / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(directory / "state.json")


def _wipe(directory: Path) -> None:
    """Delete everything in a state directory except its lock file."""
    for child in directory.iterdir() if directory.exists() else ():
        if child.is_dir():
            shutil.rmtree(child)
        elif child.name != ".lock":
            child.unlink()


def _down(name: str, kind: str, purge: bool, stop: Callable[[dict[str, Any]], bool]) -> bool:
    """Stop the service ``name`` if its state says it is a ``kind``: ``stop(state)`` stops it and says whether it ran;
    ``purge`` also deletes its state. Idempotent; True if it was running."""
    if not service_dir(name).exists():
        return False
    with service_lock(name) as directory:
        state = _read_state(directory)
        was_running = state is not None and state.get("kind") == kind and stop(state)
        if purge:
            _wipe(directory)
    return was_running
