"""Errors raised by ``orchard.sandbox``: sandbox runtimes, the sandbox REST API and its clients.

Each error that a client can cause has an HTTP status and a stable ``code`` (the ``error`` field of the API's JSON
error body), so the SDK raises the same class the runtime raised on the server.
"""

from __future__ import annotations

from typing import ClassVar

from orchard.exceptions import OrchardError


class SandboxError(OrchardError):
    """Base class of sandbox errors."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "sandbox_error"


class SandboxNotFoundError(SandboxError, KeyError):
    """No live sandbox has that id (a ``KeyError``, as ``Runtime.get`` promises)."""

    status = 404
    code = "sandbox_not_found"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "sandbox not found"


class SandboxExistsError(SandboxError):
    """A live sandbox already has that id."""

    status = 409
    code = "sandbox_exists"


class InvalidSandboxRequestError(SandboxError, ValueError):
    """A request the sandbox cannot honour (bad source directory, bad working directory, oversized source)."""

    status = 400
    code = "invalid_request"


class PathEscapeError(InvalidSandboxRequestError):
    """A path leaves the sandbox's working copy (``..``, an absolute path, a symlink pointing out)."""

    code = "path_escape"


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    """No file or directory at that path inside the sandbox."""

    status = 404
    code = "file_not_found"


class SandboxAuthError(SandboxError):
    """Missing or wrong bearer token."""

    status = 401
    code = "unauthorized"


class SandboxStartError(SandboxError):
    """The sandbox's isolation (namespaces, working copy) could not be set up."""

    status = 500
    code = "sandbox_start_failed"


ERRORS_BY_CODE: dict[str, type[SandboxError]] = {
    cls.code: cls
    for cls in (
        SandboxError,
        SandboxNotFoundError,
        SandboxExistsError,
        InvalidSandboxRequestError,
        PathEscapeError,
        SandboxFileNotFoundError,
        SandboxAuthError,
        SandboxStartError,
    )
}
"""Error classes by their API ``code``, for clients that turn an error body back into an exception."""
