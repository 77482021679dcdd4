"""The embedded store: artifacts as files under a local directory, one file per key.

Writes go to a temporary file in the target's directory, are fsynced and then renamed over the target, so a
reader (another process on the machine) sees either the old object or the complete new one, and a crash leaves
at worst a temporary file that listings skip. Directories emptied by deletes are removed, as S3 has none.

With ``fsync="never"`` (``LocalStoreConfig.fsync``) the writes are just as atomic but flushing is left to the OS, as
the embedded bus's default does: everything survives a killed process, not a lost machine. On a busy virtual disk
an fsync took ~2.6 ms, and a policy version takes four or five.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from orchard.store.base import (
    CHUNK_SIZE,
    TEMP_PREFIX,
    ArtifactStore,
    HashingReader,
    ObjectReader,
    atomic_write,
    fsync_directory,
    iter_chunks,
)
from orchard.store.exceptions import ArtifactNotFoundError, StoreError


class LocalStore(ArtifactStore):
    """An ``ArtifactStore`` in a local directory, shared safely by the processes of one machine."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self._root = Path(root).absolute()
        self._fsync = fsync

    @property
    def root(self) -> Path:
        """The directory holding the objects."""
        return self._root

    @property
    def location(self) -> str:
        """``file://`` URI of the root directory."""
        return self._root.as_uri()

    def check(self) -> None:
        """Create the root directory if needed and make sure it is writable."""
        try:
            self._root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self._root}: {exc}") from exc
        if not os.access(self._root, os.W_OK | os.X_OK):
            raise StoreError(f"store directory {self._root} is not writable by this user")

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*key.split("/"))

    def _write(self, key: str, source: HashingReader, length: int | None) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. a parent is a file: 'a' exists and 'a/b' is being written
            raise StoreError(f"cannot store {key!r} in {self.location}: {exc}") from exc
        # ``length`` needs no check here: the HashingReader raises on a short source, before the rename.
        atomic_write(path, iter_chunks(source, CHUNK_SIZE), durable=self._fsync)

    def _copy(self, src: str, dst: str) -> None:
        # A hard link: no bytes written, and the source's data is durable already; the new entry is once ``sync``
        # fsyncs its directory. Where links fail (another device, a filesystem without them), the bytes are copied.
        source, target = self._path(src), self._path(dst)
        if not source.is_file():
            raise ArtifactNotFoundError(f"{src!r} not found in {self.location}")
        temporary = target.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            if self._fsync:  # the source may have been written by a process with fsync: never (cheap if clean)
                _fsync_file(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, temporary)
            os.replace(temporary, target)
        except OSError:
            with suppress(OSError):
                temporary.unlink()
            super()._copy(src, dst)

    def _sync(self, prefix: str) -> None:
        if not self._fsync:
            return
        directory = self._path(prefix.rpartition("/")[0]) if "/" in prefix else self._root
        fsync_directory(directory)

    def _open(self, key: str) -> ObjectReader:
        try:
            handle = open(self._path(key), "rb")  # closed by the ObjectReader
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ArtifactNotFoundError(f"{key!r} not found in {self.location}") from exc
        except OSError as exc:
            raise StoreError(f"cannot open {key!r} in {self.location}: {exc}") from exc
        return ObjectReader(key, self._chunks(handle, key), handle.close)

    def _chunks(self, handle: BinaryIO, key: str) -> Iterator[bytes]:
        while True:
            try:
                chunk = handle.read(CHUNK_SIZE)
            except OSError as exc:
                raise StoreError(f"reading {key!r} from {self.location} failed: {exc}") from exc
            if not chunk:
                return
            yield chunk

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _list(self, prefix: str) -> list[str]:
        # Walk only the deepest directory the prefix names; the rest of the prefix filters names.
        directory = prefix.rpartition("/")[0]
        keys: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(self._path(directory) if directory else self._root):
            relative = Path(dirpath).relative_to(self._root).as_posix()
            for filename in filenames:
                if filename.startswith(TEMP_PREFIX):
                    continue  # an in-flight or crashed write, not an object
                key = filename if relative == "." else f"{relative}/{filename}"
                if key.startswith(prefix):
                    keys.append(key)
        return keys

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return
        except OSError as exc:
            raise StoreError(f"cannot delete {key!r} from {self.location}: {exc}") from exc
        self._prune(path.parent)

    def _prune(self, directory: Path) -> None:
        # Remove directories left empty, up to the root; a concurrent writer's directory is not empty, so it stays.
        while directory != self._root and self._root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
