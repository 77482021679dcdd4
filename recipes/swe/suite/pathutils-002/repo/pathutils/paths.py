"""Common parents and extensions of POSIX paths."""

import posixpath
from collections.abc import Sequence


def common_parent(paths: Sequence[str]) -> str:
    """The deepest directory that contains every path (compared component by component)."""
    if not paths:
        raise ValueError("common_parent() needs at least one path")
    return posixpath.commonpath(paths)


def split_ext(path: str) -> tuple[str, str]:
    """Split ``path`` into (root, extension); a leading dot of the file name does not start an extension."""
    head, _, name = path.rpartition("/")
    dot = name.rfind(".")
    if dot == -1:
        return path, ""
    prefix = head + "/" if head or path.startswith("/") else ""
    return prefix + name[:dot], name[dot:]
