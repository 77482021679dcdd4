"""The trainer backend seam's interface: ``TrainingBackend``, what the policy trainer needs from whatever holds the
model being trained, its optimizer and its scheduler.

A backend turns a micro-batch loss into gradients and gradients into an optimizer step; the trainer forms the steps,
computes and normalises the loss, publishes and checkpoints. The backends are ``torch``
(``trainers.backends.torch_backend``) and ``deepspeed`` (``trainers.backends.deepspeed_backend``); the config that
picks one is ``trainers.config.TrainerBackendConfig`` and the factory is ``trainers.backends.factory.open_backend``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel


class TrainingBackend(Protocol):
    """The operations the trainer needs from whatever holds the model and optimizer."""

    module: PreTrainedModel
    """The underlying model (state dicts, export)."""

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` of a packed row."""
        ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of one micro-batch's loss."""
        ...

    def step(self) -> float:
        """Clip, take an optimizer and a scheduler step, clear gradients; return the norm before clipping."""
        ...

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        ...

    def state_tensors(self) -> dict[str, Any]:
        """Model, optimizer and scheduler state for a checkpoint."""
        ...

    def load_state_tensors(self, tensors: dict[str, Any]) -> None:
        """Restore what ``state_tensors`` returned."""
        ...

    def export(self, directory: Path) -> dict[str, Path]:
        """Write the current weights as a checkpoint directory an engine can load; return its files."""
        ...
