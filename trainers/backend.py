"""What the policy trainer trains with: the model it loads, the learning-rate schedule, and the plain torch backend.

A backend owns the model being trained, its optimizer and scheduler, and turns a micro-batch loss into gradients and
gradients into an optimizer step. ``TorchBackend`` is the default (CPU or one GPU, AdamW, optional
``torch.compile``); ``trainers.deepspeed_backend.DeepSpeedBackend`` offers the same methods over a ZeRO engine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from trainers.config import CheckpointModelSource, PolicyTrainerConfig, ScheduleConfig, TinyModelSource
from trainers.exceptions import TrainerError

_DTYPE_KWARG = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"


def resolve_device(device: str) -> torch.device:
    """``auto``: this process's CUDA device if there is one (``LOCAL_RANK`` under a multi-GPU launcher such as
    ``deepspeed`` or ``torchrun``, else the first), otherwise the CPU."""
    if device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(device)


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether to autocast to bfloat16: ``auto`` on a CUDA device that supports it, ``bf16`` always."""
    if precision == "auto":
        return device.type == "cuda" and torch.cuda.is_bf16_supported()
    return precision == "bf16"


def load_policy_model(source: TinyModelSource | CheckpointModelSource) -> PreTrainedModel:
    """The starting weights in float32 on the CPU: a tiny-family model built from its seed, or a checkpoint."""
    hf_logging.disable_progress_bar()
    if isinstance(source, TinyModelSource):
        from orchard.engines.tiny import build_tiny_model, build_tiny_tokenizer

        model = build_tiny_model(source.name, build_tiny_tokenizer(), source.seed)
    else:
        if not (source.path / "config.json").is_file():
            raise TrainerError(f"model.path: {source.path} is not a checkpoint directory with config.json")
        model = AutoModelForCausalLM.from_pretrained(source.path, **{_DTYPE_KWARG: torch.float32})
    model.config.use_cache = False  # training never reuses a KV cache; a cache would also disable packed masks
    return model


def load_policy_tokenizer(source: TinyModelSource | CheckpointModelSource) -> PreTrainedTokenizerBase | None:
    """The tokenizer (with its chat template) that goes with the starting weights: the tiny family's own, or the
    checkpoint's; None for a checkpoint directory without tokenizer files."""
    if isinstance(source, TinyModelSource):
        from orchard.engines.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer()
    if not any((source.path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(source.path)


def lr_factor(schedule: ScheduleConfig, max_steps: int | None) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at each optimizer step (0-based), for ``LambdaLR``."""
    total = schedule.total_steps or max_steps

    def factor(step: int) -> float:
        if step < schedule.warmup_steps:
            return (step + 1) / schedule.warmup_steps
        if schedule.kind == "constant" or total is None:
            return 1.0
        progress = min(1.0, (step - schedule.warmup_steps) / max(1, total - schedule.warmup_steps))
        shape = 1.0 - progress if schedule.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * shape

    return factor


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


class TorchBackend:
    """Plain torch: AdamW, ``LambdaLR``, global-norm clipping, optional ``torch.compile`` of the forward pass."""

    def __init__(self, model: PreTrainedModel, config: PolicyTrainerConfig, device: torch.device) -> None:
        self.module = model.to(device).train()
        self.device = device
        self.grad_clip = config.grad_clip
        self.optimizer = torch.optim.AdamW(
            [p for p in self.module.parameters() if p.requires_grad],
            lr=config.lr,
            betas=config.betas,
            weight_decay=config.weight_decay,
        )
        self.peak_lr = config.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(config.schedule, config.max_steps))
        self._autocast = use_bf16(config.precision, device)
        self._forward: Callable[..., Any] = torch.compile(self.module) if config.compile else self.module

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits of a packed row; under bf16 autocast where configured."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
            return self._forward(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``."""
        loss.backward()

    def step(self) -> float:
        """Clip (if configured), step the optimizer and the schedule, clear gradients; the norm before clipping."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip is not None else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return float(self.scheduler.get_last_lr()[0])

    def state_tensors(self) -> dict[str, Any]:
        """Model, optimizer and scheduler state dicts."""
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_tensors(self, tensors: dict[str, Any]) -> None:
        """Load what ``state_tensors`` returned (strict: every tensor of the model must be there); without
        ``optimizer`` only the weights (the optimizer and schedule stay as built).

        A checkpoint written with another peak learning rate (a recipe's next stage, e.g. RL after SFT, resuming the
        SFT trainer's checkpoint) keeps its optimizer moments and step but takes this trainer's ``lr``; the same
        ``lr`` restores the schedule exactly, so a crashed trainer resumes bit for bit.
        """
        self.module.load_state_dict(tensors["model"], strict=True)
        if "optimizer" not in tensors:  # weights only: a stage that starts its optimizer and schedule fresh
            return
        self.optimizer.load_state_dict(tensors["optimizer"])
        self.scheduler.load_state_dict(tensors["scheduler"])
        if any(base != self.peak_lr for base in self.scheduler.base_lrs):
            self.scheduler.base_lrs = [self.peak_lr for _ in self.scheduler.base_lrs]
            factors = [fn(self.scheduler.last_epoch) for fn in self.scheduler.lr_lambdas]
            for group, factor in zip(self.optimizer.param_groups, factors, strict=True):
                group["initial_lr"], group["lr"] = self.peak_lr, self.peak_lr * factor
            self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # noqa: SLF001 - get_last_lr

    def export(self, directory: Path) -> dict[str, Path]:
        """``save_pretrained`` into ``directory`` (config.json, generation_config.json, model.safetensors)."""
        self.module.save_pretrained(directory)
        return {p.name: p for p in sorted(directory.iterdir()) if p.is_file()}


def open_backend(model: PreTrainedModel, config: PolicyTrainerConfig, device: torch.device) -> TrainingBackend:
    """The training backend ``config.backend`` names, holding ``model`` on ``device``: ``torch`` (AdamW here) or
    ``deepspeed`` (ZeRO, ``trainers.deepspeed_backend``; imported only when chosen, as its package is optional)."""
    if config.backend == "deepspeed":
        from trainers.deepspeed_backend import DeepSpeedBackend

        return DeepSpeedBackend(model, config, device)
    return TorchBackend(model, config, device)
