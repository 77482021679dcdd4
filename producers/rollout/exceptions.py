"""Errors of the rollout scheduler; every one derives from ``RolloutError``."""

from orchard.exceptions import OrchardError


class RolloutError(OrchardError):
    """Base class of every rollout scheduler error."""


class SubmissionError(RolloutError):
    """Orchard Env refused or could not take an episode submission (the message has its status and answer)."""
