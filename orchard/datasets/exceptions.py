"""Errors of dataset import and export."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class DatasetError(OrchardError):
    """A dataset cannot be read or written at all (bad layout, unreadable file, unknown option)."""


class RowError(DatasetError):
    """One row of a dataset is malformed; the importer dead-letters it with ``reason`` and carries on."""

    def __init__(self, reason: str, error_type: str = "MalformedRowError") -> None:
        """``reason`` is the human-readable cause, ``error_type`` the class of problem recorded in the letter."""
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type
