"""``open_backend``: the one place that turns the trainer's ``backend`` config into a backend (each imported only
when used, as DeepSpeed is an optional package)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from trainers.backends.base import TrainingBackend
from trainers.config import DeepSpeedBackendConfig, PolicyTrainerConfig, TorchBackendConfig


def open_backend(model: PreTrainedModel, config: PolicyTrainerConfig, device: torch.device) -> TrainingBackend:
    """The training backend ``config.backend`` names, holding ``model`` on ``device``: ``torch`` (AdamW) or
    ``deepspeed`` (ZeRO, with ``config.backend.config`` merged on top). The backend also reads the trainer's
    optimisation settings (``lr``, ``betas``, ``grad_clip``, ``precision``, ``schedule``, ...), hence the whole
    config."""
    match config.backend:
        case TorchBackendConfig():
            from trainers.backends.torch_backend import TorchBackend

            return TorchBackend(model, config, device)
        case DeepSpeedBackendConfig():
            from trainers.backends.deepspeed_backend import DeepSpeedBackend

            return DeepSpeedBackend(model, config, device)
        case other:
            raise TypeError(f"unknown trainer backend config {type(other).__name__}")
