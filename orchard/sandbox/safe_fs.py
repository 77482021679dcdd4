"""File operations confined to a directory, safe against paths and symlinks that point out of it.

The runtime may be root while the directory belongs to an untrusted sandbox that can change it at any moment, so
paths are never resolved as strings. Each component is opened relative to its parent's file descriptor with
``O_NOFOLLOW``; a symlink met on the way is read and followed by hand: a relative target continues the walk (its
``..`` pops real directories, and popping the root is an escape), an absolute target is an escape. A symlink swapped
in between a check and an open makes the open fail instead of following it. Writes go to a temporary file renamed
into place, so a hard link planted by the sandbox never lets a write reach another file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections import deque
from collections.abc import Iterator
from pathlib import Path

from orchard.sandbox import FileEntry
from orchard.sandbox.exceptions import InvalidSandboxRequestError, PathEscapeError, SandboxFileNotFoundError

MAX_SYMLINK_HOPS = 40
MAX_NAME_BYTES = 255
"""Longest file name (one path component) Linux file systems take (NAME_MAX)."""
MAX_PATH_BYTES = 4095
"""Longest path a sandbox may name (PATH_MAX less its NUL)."""
MAX_LISTED = 100_000
"""A recursive listing stops after this many entries (a sandbox holds at most ~200,000 files)."""
MAX_DEPTH = 256
"""A recursive listing does not descend deeper than this (nesting thousands deep is possible)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def split_path(path: str) -> list[str]:
    """The components of a relative sandbox path (``.`` and empty ones dropped, ``..`` kept).

    >>> split_path("a/./b/../c/")
    ['a', 'b', '..', 'c']
    """
    if "\x00" in path:
        raise InvalidSandboxRequestError("path contains a NUL byte")
    if path.startswith("/"):
        raise PathEscapeError(f"absolute path {path!r}: paths are relative to the working copy")
    if _encoded_size(path) > MAX_PATH_BYTES:
        raise InvalidSandboxRequestError(f"path is {_encoded_size(path)} bytes long; the limit is {MAX_PATH_BYTES}")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    for part in parts:
        if _encoded_size(part) > MAX_NAME_BYTES:
            raise InvalidSandboxRequestError(
                f"path component {part[:40]!r}... is {_encoded_size(part)} bytes long; the limit is {MAX_NAME_BYTES}"
            )
    return parts


def _encoded_size(text: str) -> int:
    """Bytes of ``text`` as a file name (undecodable bytes kept as the file system encoding keeps them)."""
    try:
        return len(os.fsencode(text))
    except UnicodeEncodeError:
        raise InvalidSandboxRequestError(f"path {text[:40]!r} is not valid UTF-8") from None


class _Walk:
    """Open directory descriptors from the root down to the parent of the last component."""

    def __init__(self, root_fd: int) -> None:
        self.fds = [root_fd]
        self.names: list[str] = []

    @property
    def fd(self) -> int:
        return self.fds[-1]

    def push(self, name: str) -> None:
        self.fds.append(os.open(name, _DIR_FLAGS, dir_fd=self.fd))
        self.names.append(name)

    def pop(self, original: str) -> None:
        if len(self.fds) == 1:
            raise PathEscapeError(f"path {original!r} leaves the working copy")
        os.close(self.fds.pop())
        self.names.pop()

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


class ConfinedDirectory:
    """A directory whose files are read and written by path, never outside it."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        """``owner``: uid and gid given to everything created (the sandbox's, when the runtime is root)."""
        self.root = root
        self.owner = owner

    @contextlib.contextmanager
    def _resolve(
        self, path: str, *, follow_last: bool, make_parents: bool = False
    ) -> Iterator[tuple[_Walk, str | None]]:
        """Yield the walk to the parent of the last component and that component (None: ``path`` is the root or
        resolved to a directory that is now ``walk.fd``)."""
        pending = deque(split_path(path))
        try:
            walk = _Walk(os.open(self.root, _DIR_FLAGS))
        except OSError as exc:  # the sandbox removed or replaced its own working copy
            raise SandboxFileNotFoundError(f"the working copy {self.root} is gone ({exc.strerror})") from exc
        try:
            yield walk, self._walk(walk, pending, path, follow_last, make_parents)
        finally:
            walk.close()

    def _walk(self, walk: _Walk, pending: deque[str], path: str, follow_last: bool, make_parents: bool) -> str | None:
        hops = 0
        while pending:
            name = pending.popleft()
            if name == "..":
                walk.pop(path)
                continue
            last = not pending
            if last and not follow_last:
                return name
            try:
                mode = os.stat(name, dir_fd=walk.fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                if last:
                    return name
                if not make_parents:
                    raise SandboxFileNotFoundError(f"{path!r}: no directory {name!r}") from None
                os.mkdir(name, 0o755, dir_fd=walk.fd)
                self._chown(name, walk.fd)
                mode = stat.S_IFDIR
            if stat.S_ISLNK(mode):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise PathEscapeError(f"{path!r}: too many levels of symbolic links")
                target = os.readlink(name, dir_fd=walk.fd)
                if target.startswith("/"):
                    raise PathEscapeError(f"{path!r}: symlink {name!r} points outside the working copy ({target})")
                pending.extendleft(reversed(split_path(target)))
                continue
            if last and not stat.S_ISDIR(mode):
                return name
            if not stat.S_ISDIR(mode):
                raise InvalidSandboxRequestError(f"{path!r}: {name!r} is not a directory")
            walk.push(name)
        return None

    def _chown(self, name: str, dir_fd: int) -> None:
        if self.owner is not None:
            os.chown(name, *self.owner, dir_fd=dir_fd, follow_symlinks=False)

    def directory(self, path: str) -> str:
        """The absolute path of an existing directory inside, symlinks resolved (for a command's cwd)."""
        with self._resolve(path, follow_last=True) as (walk, name):
            if name is not None:
                if _exists(name, walk.fd):
                    raise InvalidSandboxRequestError(f"{path!r} is not a directory")
                raise SandboxFileNotFoundError(f"no directory {path!r}")
            return os.path.join(self.root, *walk.names)

    def read(self, path: str) -> bytes:
        """A regular file's content."""
        with self._resolve(path, follow_last=True) as (walk, name):
            if name is None:
                raise InvalidSandboxRequestError(f"{path!r} is a directory")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=walk.fd)
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no file {path!r}") from None
            except OSError as exc:
                raise _open_error(path, exc) from exc
            with os.fdopen(fd, "rb") as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise InvalidSandboxRequestError(f"{path!r} is not a regular file")
                self._check_planted_link(path, info)
                return handle.read()

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a regular file (parent directories created), atomically."""
        with self._resolve(path, follow_last=True, make_parents=True) as (walk, name):
            if name is None:
                raise InvalidSandboxRequestError(f"{path!r} is a directory")
            temp = f".orchard-write-{secrets.token_hex(6)}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(temp, flags, 0o600, dir_fd=walk.fd)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    os.fchmod(handle.fileno(), mode & 0o777)  # no setuid/setgid/sticky bits
                    if self.owner is not None:
                        os.fchown(handle.fileno(), *self.owner)
                os.replace(temp, name, src_dir_fd=walk.fd, dst_dir_fd=walk.fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=walk.fd)
                raise

    def delete(self, path: str) -> None:
        """Remove a file, a symlink (not its target) or a directory tree."""
        with self._resolve(path, follow_last=False) as (walk, name):
            if name is None:
                raise InvalidSandboxRequestError("cannot delete the working copy itself")
            try:
                mode = os.stat(name, dir_fd=walk.fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                raise SandboxFileNotFoundError(f"no file {path!r}") from None
            if stat.S_ISDIR(mode):
                shutil.rmtree(name, dir_fd=walk.fd)
            else:
                os.unlink(name, dir_fd=walk.fd)

    def list(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        """Entries under a directory (or the one entry of a file), paths relative to the root, sorted."""
        with self._resolve(path, follow_last=True) as (walk, name):
            prefix = "/".join(walk.names)
            if name is not None:
                try:
                    info = os.stat(name, dir_fd=walk.fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise SandboxFileNotFoundError(f"no file or directory {path!r}") from None
                return [_entry(_join(prefix, name), info)]
            entries: list[FileEntry] = []
            _scan(walk.fd, prefix, recursive, entries)
            return sorted(entries, key=lambda e: e.path)

    def _check_planted_link(self, path: str, info: os.stat_result) -> None:
        """Refuse a hard link to a file the sandbox does not own (it may be a host file linked in)."""
        if self.owner is not None and info.st_nlink > 1 and info.st_uid != self.owner[0]:
            raise PathEscapeError(f"{path!r} is a hard link to a file the sandbox does not own")


MAX_LISTED = 100_000
"""A recursive listing stops after this many entries (a sandbox can hold at most ~200,000 files)."""
MAX_DEPTH = 256
"""A recursive listing does not descend below this depth (``PATH_MAX`` allows thousands of nested directories)."""


def _scan(dir_fd: int, prefix: str, recursive: bool, out: list[FileEntry]) -> None:
    """List ``dir_fd`` into ``out`` depth first, without recursion (a sandbox may nest directories thousands deep):
    one descriptor per level, at most ``MAX_DEPTH`` levels, and at most ``MAX_LISTED`` entries."""
    stack: list[tuple[int | None, str, Iterator[os.DirEntry[str]]]] = [(None, prefix, os.scandir(dir_fd))]
    try:
        while stack and len(out) < MAX_LISTED:
            fd, rel_dir, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                _close_level(stack.pop())
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # removed meanwhile
            rel = _join(rel_dir, entry.name)
            out.append(_entry(rel, info))
            if recursive and stat.S_ISDIR(info.st_mode) and len(stack) < MAX_DEPTH:
                _descend(stack, entry.name, rel, dir_fd if fd is None else fd)
    finally:
        while stack:
            _close_level(stack.pop())


def _descend(stack: list[tuple[int | None, str, Iterator[os.DirEntry[str]]]], name: str, rel: str, parent: int) -> None:
    try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return  # replaced meanwhile
    try:
        stack.append((sub, rel, os.scandir(sub)))
    except OSError:
        os.close(sub)


def _close_level(level: tuple[int | None, str, Iterator[os.DirEntry[str]]]) -> None:
    fd, _, entries = level
    close = getattr(entries, "close", None)
    if close is not None:
        close()
    if fd is not None:
        os.close(fd)


def _entry(path: str, info: os.stat_result) -> FileEntry:
    mode = info.st_mode
    kind = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else "other"
    return FileEntry(path=path, kind=kind, size=info.st_size)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _open_error(path: str, exc: OSError) -> Exception:
    if exc.errno == errno.ELOOP:
        return PathEscapeError(f"{path!r} was replaced by a symlink while being opened")
    if exc.errno == errno.EISDIR:
        return InvalidSandboxRequestError(f"{path!r} is a directory")
    return InvalidSandboxRequestError(f"cannot open {path!r}: {exc.strerror}")
