"""Errors raised by ``orchard.store``; every one derives from ``StoreError`` so callers can catch the family."""

from orchard.exceptions import OrchardError


class StoreError(OrchardError):
    """Base class of every store error; also raised as is for failures that fit no narrower class."""


class StoreUnavailableError(StoreError):
    """The store could not be reached in bounded time (connection refused, timeout, server error)."""


class StoreAuthError(StoreError):
    """The store rejected the credentials or denied the operation."""


class ArtifactNotFoundError(StoreError):
    """The key, or the version of an artifact, does not exist."""


class IntegrityError(StoreError):
    """Stored data does not match what its manifest promises (size or sha256), or a manifest is unreadable."""


class InvalidKeyError(StoreError, ValueError):
    """A key, prefix, artifact name or file path is malformed; nothing was read or written."""


class VersionExistsError(StoreError):
    """A version is published only once: its manifest already exists."""


class SourceReadError(StoreError):
    """The local file or stream being uploaded failed to read; nothing was stored under the key."""
