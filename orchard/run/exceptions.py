"""Errors of ``orchard run``."""

from orchard.exceptions import OrchardError


class RunError(OrchardError):
    """A run cannot start or continue: its directory is in use, or it does not match the run it resumes."""
