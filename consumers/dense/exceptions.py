"""Errors of the dense-reward plug-ins. Each names the episode and call it was scoring, so a dead letter says which."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class DenseRewardError(OrchardError):
    """A dense reward could not be computed for a step (the runtime dead-letters the trajectory)."""


class EngineUnreachableError(DenseRewardError):
    """The teacher or judge engine could not be reached (connection refused, timed out) after the retries."""


class EngineAnswerError(DenseRewardError):
    """The engine answered with an error status or a body that is not an OpenAI completion."""


class TokenMismatchError(DenseRewardError):
    """The engine scored a different number of tokens (or other token ids) than were sent."""


class StepDataError(DenseRewardError):
    """The step itself cannot be scored (e.g. its logprobs do not match its completion tokens)."""
