"""Errors raised by ``orchard.env``, the episode service (the sandboxes' own are in ``orchard.sandbox.exceptions``)."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class InvalidEpisodeError(OrchardError):
    """A submitted episode that could never run (an unknown task or harness, harness options the adapter refuses):
    the Env refuses it at submission, before any episode exists."""
