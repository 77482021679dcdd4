"""Grading in a local sandbox once the agent is done: the grader's own files, written where the sandbox's uid can
read but not change them, and the outputs it leaves, read back without following what the agent could have planted
(``LocalSandbox.run_grader`` runs the command between the two), all in directories of their own, apart from the
sandbox's files."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

from orchard.sandbox.exceptions import InvalidSandboxRequestError
from orchard.sandbox.local.mounts import mount_scratch, unmount
from orchard.sandbox.local.provisioning import remove_tree

MIB = 1024 * 1024
LEGACY_SIGNALS_FILE = ".orchard-signals.json"
GRADER_SCRATCH_MB = 64
"""Room for what a grader writes (outputs, home), beyond its own files."""
MAX_GRADER_OUTPUT_BYTES = 4 * MIB
"""What ``run_grader`` reads back of each file the grader wrote (its signals are a few hundred bytes)."""


@contextlib.contextmanager
def grader_directories(
    root: Path, sandbox_id: str, files: Mapping[str, bytes], *, owner: tuple[int, int] | None, scratch: bool
) -> Iterator[tuple[Path, Path, Path]]:
    """Fresh directories of one grading run under the runtime's ``root``, removed afterwards: the grader's ``files``
    (``write_grader_files``), then its output directory and its home (owned by the sandbox's uid ``owner``)."""
    # Outside the sandbox's own files (which the agent may have filled to the last byte and inode), on a tmpfs
    # of its own where the runtime is root: the grader's writes cannot reach the host's disk either.
    base = root / f".grader-{sandbox_id}-{secrets.token_hex(4)}"
    base.mkdir(mode=0o755)
    mounted = False
    try:
        if scratch:
            size_mb = sum(len(data) for data in files.values()) // MIB + GRADER_SCRATCH_MB
            mount_scratch(base, size_mb, None, mode=0o755)
            mounted = True
        grader, out, home = base / "grader", base / "out", base / "home"
        write_grader_files(grader, files)
        for directory in (out, home):
            directory.mkdir(mode=0o700)
            if owner is not None:
                os.chown(directory, *owner)
        yield grader, out, home
    finally:
        if mounted:
            unmount(base)
        remove_tree(base)


def write_grader_files(directory: Path, files: Mapping[str, bytes]) -> None:
    """The grader's files in a new directory owned by root (directories 0755, files 0644: readable, not writable,
    by the sandbox's uid); a path that leaves the directory is refused."""
    directory.mkdir(mode=0o755)
    for relative, data in files.items():
        path = (directory / relative).resolve()
        if not path.is_relative_to(directory.resolve()) or path == directory.resolve():
            raise InvalidSandboxRequestError(f"grader file {relative!r} leaves the grader's directory")
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, 0o644)


def read_grader_outputs(directory: Path, max_files: int = 64) -> dict[str, bytes]:
    """The regular files the grader left at the top of ``directory`` (symbolic links, devices, FIFOs and
    subdirectories ignored), by name, each cut at ``MAX_GRADER_OUTPUT_BYTES``."""
    outputs: dict[str, bytes] = {}
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if len(outputs) >= max_files:
                break
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as handle:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    outputs[entry.name] = handle.read(MAX_GRADER_OUTPUT_BYTES)
    return outputs
