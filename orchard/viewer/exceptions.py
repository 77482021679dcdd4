"""Errors of the trajectory viewer; the app turns each into a 4xx answer with its message."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class ViewerError(OrchardError):
    """Base class of viewer errors."""


class NotFoundError(ViewerError):
    """An episode, artifact or run file asked for that the run does not have (HTTP 404)."""


class BadQueryError(ViewerError):
    """A filter or parameter value the viewer cannot use (HTTP 422)."""
