"""Errors raised by the trainers; every one derives from ``TrainerError``."""

from orchard.exceptions import OrchardError


class TrainerError(OrchardError):
    """Base class of every trainer error."""


class InvalidSampleError(TrainerError):
    """A ``TrainingSample`` whose arrays do not fit together (lengths differ, too short); it is skipped."""


class CheckpointError(TrainerError):
    """A trainer checkpoint cannot be written, read or applied (another model, missing files)."""


class BackendUnavailableError(TrainerError):
    """The configured training backend cannot run here (DeepSpeed not installed, no GPU for it)."""
