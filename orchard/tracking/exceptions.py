"""Errors of experiment tracking."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class TrackingError(OrchardError):
    """A tracker could not be opened, written or closed, or the follower's state could not be kept."""


class TrackerUnavailableError(TrackingError):
    """The tracker's package is not installed; the message names the extra that installs it."""
