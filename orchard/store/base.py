"""The store contract: keys, streamed reads and writes hashed in one pass, and the ``ArtifactStore`` ABC.

A backend implements five primitive hooks (write, open, exists, list, delete) on already validated keys; every
public operation, and the versioned-artifact logic of ``orchard.store.versions``, is written once here on top of
them. Data always moves in chunks of ``CHUNK_SIZE`` (or the S3 part size), so multi-GB weight files never sit in
memory, and the sha256 of an upload or a download is computed while the bytes pass through.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from time import perf_counter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from orchard.logging import get_logger
from orchard.store.exceptions import IntegrityError, InvalidKeyError, SourceReadError, StoreError

if TYPE_CHECKING:
    from orchard.store.manifest import Manifest

CHUNK_SIZE = 1024 * 1024
"""Bytes moved per read or write when streaming."""

TEMP_PREFIX = ".orchard-tmp-"
"""Name prefix of in-flight temporary files; key parts may not start with it, so listings can skip them."""

_MAX_KEY_BYTES = 1024  # the S3 limit on object names, applied to every backend so keys stay portable

_log = get_logger("store")


class Reader(Protocol):
    """Anything with a binary ``read(size)``: an open file, ``io.BytesIO``, a pipe, an ``ObjectReader``."""

    def read(self, size: int = -1, /) -> bytes:
        """Return up to ``size`` bytes; ``b""`` at the end of the stream."""
        ...


def iter_chunks(reader: Reader, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Iterate ``reader`` in chunks of at most ``chunk_size`` bytes until it returns ``b""``."""
    return iter(partial(reader.read, chunk_size), b"")


@dataclass(frozen=True)
class ObjectInfo:
    """What one streamed upload or download moved: the key, its size in bytes and the sha256 of its content."""

    key: str
    size: int
    sha256: str


def validate_key(key: str, what: str = "key") -> str:
    """Return ``key`` if it is a valid store key, else raise ``InvalidKeyError`` saying what is wrong.

    A key is ``/``-separated, relative (no leading ``/``), with no empty, ``.`` or ``..`` parts, no backslash or
    control characters, at most 1024 bytes, and no part starting with the reserved temporary-file prefix.
    """
    problem = _key_problem(key)
    if problem is not None:
        raise InvalidKeyError(f"invalid {what} {key!r}: {problem}")
    return key


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is ``""`` or a valid key, optionally ending with ``/``; else ``InvalidKeyError``."""
    if prefix:
        validate_key(prefix.removesuffix("/"), what="prefix")
    return prefix


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str) or not key:
        return "must be a non-empty string"
    if key.startswith("/"):
        return "must not start with '/'"
    if len(key.encode("utf-8")) > _MAX_KEY_BYTES:
        return f"longer than {_MAX_KEY_BYTES} bytes"
    if "\\" in key or not key.isprintable():
        return "backslashes and control characters are not allowed"
    for part in key.split("/"):
        if not part:
            return "empty part (a doubled or trailing '/')"
        if part in (".", ".."):
            return f"'{part}' parts are not allowed"
        if part.startswith(TEMP_PREFIX):
            return f"parts starting with {TEMP_PREFIX!r} are reserved for temporary files"
    return None


class HashingReader:
    """Wraps the source of an upload: hashes and counts every byte handed on, so an upload is hashed in one pass.

    With ``limit`` it hands on exactly that many bytes: never more, and a source that ends early raises, before
    any backend commits the object. Errors of the source become ``SourceReadError``, so a caller can tell a bad
    source from a bad store.
    """

    def __init__(self, source: Reader, key: str, limit: int | None = None) -> None:
        self._source = source
        self._key = key
        self._limit = limit
        self._digest = hashlib.sha256()
        self.size = 0

    @property
    def sha256(self) -> str:
        """Hex sha256 of the bytes read so far."""
        return self._digest.hexdigest()

    def read(self, size: int = -1, /) -> bytes:
        """Read up to ``size`` bytes from the source (all that is left when negative)."""
        if self._limit is not None:
            remaining = self._limit - self.size
            if remaining == 0:
                return b""
            size = remaining if size < 0 else min(size, remaining)
        try:
            data = bytes(self._source.read(size))
        except Exception as exc:
            raise SourceReadError(f"reading the source of {self._key!r} failed after {self.size} bytes: {exc}") from exc
        if not data and self._limit is not None and size != 0:
            raise SourceReadError(f"the source of {self._key!r} ended after {self.size} of {self._limit} bytes")
        self._digest.update(data)
        self.size += len(data)
        return data


class ObjectReader(Iterator[bytes]):
    """A stored object streamed in chunks: iterate it, or ``read(size)`` it like a file; close it when done.

    Closing releases the file or HTTP connection; use it as a context manager. ``open_read`` raises
    ``ArtifactNotFoundError`` at once for a missing key, so iteration only fails on I/O errors.
    """

    def __init__(self, key: str, chunks: Iterator[bytes], on_close: Callable[[], None]) -> None:
        self.key = key
        self._chunks = chunks
        self._on_close = on_close
        self._buffer = bytearray()
        self._closed = False

    def __next__(self) -> bytes:
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        return next(self._chunks)

    def read(self, size: int = -1, /) -> bytes:
        """Read up to ``size`` bytes (everything left when negative); ``b""`` at the end."""
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        size = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def close(self) -> None:
        """Release the underlying file or connection; safe to call twice."""
        if not self._closed:
            self._closed = True
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
            self._on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def atomic_write(
    path: Path, chunks: Iterable[bytes], check: Callable[[int, str], None] | None = None, *, durable: bool = True
) -> ObjectInfo:
    """Write ``chunks`` to ``path`` atomically: a temporary file in the same directory, fsync, ``os.replace``.
    ``durable=False`` skips the fsyncs of the file and its directory (a scratch file: atomic, not crash-proof).

    ``check(size, sha256)`` runs after the data is on disk and before the rename; if it raises, nothing appears
    at ``path``. Readers see the old file or the complete new one, never a prefix. OS errors become ``StoreError``.
    """
    digest, size, tmp = hashlib.sha256(), 0, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide artifacts from the engines' user
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        if check is not None:
            check(size, digest.hexdigest())
        os.replace(tmp, path)
        tmp = None
        if durable:
            fsync_directory(path.parent)
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc}") from exc
    finally:
        if tmp is not None:
            with suppress(OSError):
                os.unlink(tmp)
    return ObjectInfo(key=path.name, size=size, sha256=digest.hexdigest())


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a rename, a link) durable, where the filesystem allows it."""
    # The rename is durable only once the directory entry is; not every filesystem lets a directory be fsynced.
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _expect(key: str, sha256: str | None, size: int | None) -> Callable[[int, str], None]:
    def check(actual_size: int, actual_sha256: str) -> None:
        if size is not None and actual_size != size:
            raise IntegrityError(f"{key!r}: expected {size} bytes, got {actual_size}")
        if sha256 is not None and actual_sha256 != sha256:
            raise IntegrityError(f"{key!r}: expected sha256 {sha256}, got {actual_sha256}")

    return check


class ArtifactStore(ABC):
    """A store of immutable-by-convention objects under ``/``-separated keys, plus versioned artifacts.

    Backends implement ``location``, ``check`` and the ``_write``/``_open``/``_exists``/``_list``/``_delete``
    hooks; keys reach the hooks already validated. A key cannot be both an object and the prefix of another
    object's key (a directory on disk). Every I/O failure is a ``StoreError`` subclass; malformed keys raise
    ``InvalidKeyError`` (also a ``ValueError``), other malformed arguments ``ValueError``.
    """

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the store lives, for messages and logs: ``file:///...`` or ``s3://host:port/bucket``."""

    @abstractmethod
    def check(self) -> None:
        """Verify the store is reachable and usable (creating its root or bucket); raise a ``StoreError`` if not."""

    def close(self) -> None:  # noqa: B027 - a no-op default, overridden by backends that hold connections
        """Release connections; the store is unusable afterwards."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"

    # Backend hooks: called with validated keys.

    @abstractmethod
    def _write(self, key: str, source: HashingReader, length: int | None) -> None:
        """Store everything ``source`` yields under ``key``, committing only once the source is exhausted."""

    @abstractmethod
    def _open(self, key: str) -> ObjectReader:
        """Open ``key`` for streaming; raise ``ArtifactNotFoundError`` now if it does not exist."""

    @abstractmethod
    def _exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abstractmethod
    def _list(self, prefix: str) -> list[str]:
        """Every key starting with ``prefix`` (a plain string prefix), in any order."""

    @abstractmethod
    def _delete(self, key: str) -> None:
        """Delete ``key``; a missing key is not an error."""

    def _copy(self, src: str, dst: str) -> None:
        """Store ``src``'s content under ``dst`` as well; backends with a server-side copy override this."""
        with self._open(src) as reader:
            self._write(dst, HashingReader(reader, dst), None)

    def _sync(self, prefix: str) -> None:  # noqa: B027 - a no-op default: most writes are durable when they return
        """Make the copies made under ``prefix`` durable; a backend whose ``_copy`` defers that overrides this."""

    def _delete_many(self, keys: list[str]) -> None:
        """Delete ``keys``; backends with a batch delete override this."""
        for key in keys:
            self._delete(key)

    # Primitive operations.

    def put_stream(self, key: str, reader: Reader, length: int | None = None) -> ObjectInfo:
        """Stream ``reader`` into ``key`` in chunks, returning the size and sha256 of what was stored.

        With ``length`` exactly that many bytes are stored, and a shorter source is an error. Nothing is visible
        under ``key`` unless the whole stream was stored; a failing reader raises ``SourceReadError``.
        """
        validate_key(key)
        if length is not None and length < 0:
            raise ValueError(f"length must be >= 0 or None, got {length}")
        source = HashingReader(reader, key, limit=length)
        start = perf_counter()
        self._write(key, source, length)
        info = ObjectInfo(key=key, size=source.size, sha256=source.sha256)
        seconds = round(perf_counter() - start, 3)
        _log.debug("object stored", location=self.location, key=key, size=info.size, seconds=seconds)
        return info

    def put_file(self, key: str, path: Path) -> ObjectInfo:
        """Upload the local file at ``path`` to ``key`` (streamed), returning its size and sha256."""
        validate_key(key)
        try:
            handle = open(path, "rb")
        except OSError as exc:
            raise SourceReadError(f"cannot read {path} to store it as {key!r}: {exc}") from exc
        with handle:
            return self.put_stream(key, handle, length=os.fstat(handle.fileno()).st_size)

    def copy(self, src: str, dst: str) -> None:
        """Store the object at ``src`` under ``dst`` too, without its bytes passing through this process where the
        backend can (a hard link on disk, a server-side copy on S3); ``ArtifactNotFoundError`` if ``src`` is
        missing. Like every write, ``dst`` appears whole or not at all; it is durable once ``sync`` of its prefix
        returns (a link's directory entry is fsynced there, once for many copies)."""
        self._copy(validate_key(src), validate_key(dst))

    def sync(self, prefix: str) -> None:
        """Make every ``copy`` to a key under ``prefix`` (a ``dir/`` prefix) durable."""
        self._sync(validate_prefix(prefix))

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        """Store ``data`` under ``key``, for small objects such as manifests."""
        return self.put_stream(key, io.BytesIO(data), length=len(data))

    def open_read(self, key: str) -> ObjectReader:
        """Open ``key`` as a stream of chunks; raises ``ArtifactNotFoundError`` at once if it does not exist."""
        return self._open(validate_key(key))

    def get_bytes(self, key: str) -> bytes:
        """The whole content of ``key``, for small objects such as manifests."""
        with self.open_read(key) as reader:
            return b"".join(reader)

    def get_file(
        self, key: str, dest_path: Path, *, sha256: str | None = None, size: int | None = None, durable: bool = True
    ) -> ObjectInfo:
        """Stream ``key`` into the local file ``dest_path`` atomically, returning the size and sha256 downloaded.

        When ``sha256`` or ``size`` is given, a mismatch raises ``IntegrityError`` and leaves nothing at
        ``dest_path``; the hash is computed while the bytes are written, in one pass. ``durable=False`` skips the
        fsyncs (a scratch copy that is deleted once used).
        """
        dest = Path(dest_path)
        with self.open_read(key) as reader:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create {dest.parent}: {exc}") from exc
            info = atomic_write(dest, reader, check=_expect(key, sha256, size), durable=durable)
        return ObjectInfo(key=key, size=info.size, sha256=info.sha256)

    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""
        return self._exists(validate_key(key))

    def list(self, prefix: str = "") -> list[str]:
        """Sorted keys starting with ``prefix`` (a string prefix: ``"a/b"`` matches ``"a/bc"``; end it with ``/``)."""
        return sorted(self._list(validate_prefix(prefix)))

    def delete(self, key: str) -> None:
        """Delete ``key``; deleting a missing key is not an error (S3 cannot tell cheaply)."""
        self._delete(validate_key(key))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix`` and return how many; an empty prefix is refused."""
        if not prefix:
            raise InvalidKeyError("refusing to delete with an empty prefix (the whole store)")
        keys = self._list(validate_prefix(prefix))
        if keys:
            self._delete_many(keys)
        return len(keys)

    # Versioned artifacts, written once in orchard.store.versions on top of the primitives above.

    def publish_version(
        self,
        name: str,
        version: int,
        files: Mapping[str, Path | Reader],
        metadata: Mapping[str, Any] | None = None,
        *,
        base: Manifest | None = None,
    ) -> Manifest:
        """Upload ``files`` as version ``version`` of ``name``, manifest last, copying within the store the small
        files ``base`` (an earlier version's manifest) already holds; see ``versions.publish_version``."""
        return _versions().publish_version(self, name, version, files, metadata, base=base)

    def list_versions(self, name: str) -> list[int]:
        """Complete versions of ``name`` (those with a manifest), ascending."""
        return _versions().list_versions(self, name)

    def latest_version(self, name: str) -> int | None:
        """The newest complete version of ``name``, or ``None``."""
        return _versions().latest_version(self, name)

    def read_manifest(self, name: str, version: int, sha256: str | None = None) -> Manifest:
        """The manifest of version ``version`` of ``name`` (checked against ``sha256`` if given);
        ``ArtifactNotFoundError`` if it was not published."""
        return _versions().read_manifest(self, name, version, sha256)

    def read_version_files(self, manifest: Manifest) -> dict[str, bytes]:
        """Every file of a version in memory, sizes and sha256 verified; see ``versions.read_version_files``."""
        return _versions().read_version_files(self, manifest)

    def download_version(
        self,
        name: str,
        version: int,
        dest_dir: Path,
        verify: bool = True,
        *,
        manifest: Manifest | None = None,
        durable: bool = True,
    ) -> Manifest:
        """Download a version into ``dest_dir``, verifying sizes and sha256; see ``versions.download_version``."""
        return _versions().download_version(
            self, name, version, dest_dir, verify=verify, manifest=manifest, durable=durable
        )

    def gc(self, name: str, keep_last: int) -> list[int]:
        """Delete old and abandoned versions of ``name``, keeping the newest ``keep_last``; see ``versions.gc``."""
        return _versions().gc(self, name, keep_last)


def _versions() -> Any:
    # Imported on use: versions (and manifest) build on this module's key validation, so importing them at the top
    # would be circular.
    from orchard.store import versions

    return versions
