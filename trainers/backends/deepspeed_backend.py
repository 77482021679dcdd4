"""The ``deepspeed`` trainer backend: ZeRO behind the policy trainer, for models that do not fit one GPU
(``backend: {type: deepspeed, config: {...}}``, or ``backend: deepspeed`` for no extra options).

Install with ``pip install 'orchard-rl[deepspeed]'`` and launch one trainer process per GPU with DeepSpeed's launcher
(``deepspeed --num_gpus 8 --no_local_rank "$(command -v orchard)" train policy --config trainer.yaml``; each rank
finds its GPU from ``LOCAL_RANK`` with ``device: auto``); every rank consumes the samples
topic in the same consumer group, so the partitions (and the samples) are shared among the ranks. The adapter keeps
the trainer's contract (``trainers.backends.base.TrainingBackend``): the trainer still forms steps, computes the loss
and normalises it by the step's loss tokens, and this backend turns it into ``engine.backward`` / ``engine.step``.

What the config maps to: ``lr``, ``betas``, ``weight_decay`` -> an AdamW optimizer in the DeepSpeed config;
``grad_clip`` -> ``gradient_clipping``; ``precision`` -> ``bf16.enabled``; ``backend.config`` is merged on top
(``zero_optimization.stage``, offload, ...). ``gradient_accumulation_steps`` is 1: the trainer already accumulates
over the micro-batches of a step and calls ``step`` once per optimizer step.

Limits of this adapter: checkpoints hold the consolidated 16-bit weights and DeepSpeed's own optimizer shards are not
stored in Orchard checkpoints (a resumed run restarts the optimizer moments; use ZeRO stage <= 2 for exact
resumption through ``state_tensors``); the learning-rate schedule is the trainer's ``LambdaLR`` applied to the
DeepSpeed optimizer. It is exercised only where DeepSpeed and GPUs exist; the unit tests cover the error raised when
DeepSpeed is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from trainers.config import DeepSpeedBackendConfig, PolicyTrainerConfig
from trainers.exceptions import BackendUnavailableError
from trainers.model import lr_factor, use_bf16


def deepspeed_available() -> bool:
    """Whether the ``deepspeed`` package can be imported."""
    return importlib.util.find_spec("deepspeed") is not None


def require_deepspeed() -> Any:
    """Import and return ``deepspeed``, or raise ``BackendUnavailableError`` saying how to install it."""
    if not deepspeed_available():
        raise BackendUnavailableError(
            "backend: deepspeed needs the deepspeed package; install it with pip install 'orchard-rl[deepspeed]' "
            "(or set backend: torch)"
        )
    return importlib.import_module("deepspeed")


def deepspeed_config(config: PolicyTrainerConfig, device: torch.device) -> dict[str, Any]:
    """The DeepSpeed config the trainer config maps to, with the deepspeed backend's ``config`` merged on top."""
    base: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": config.lr, "betas": list(config.betas), "weight_decay": config.weight_decay},
        },
        "bf16": {"enabled": use_bf16(config.precision, device)},
        "zero_optimization": {"stage": 2},
    }
    if config.grad_clip is not None:
        base["gradient_clipping"] = config.grad_clip
    options = config.backend.config if isinstance(config.backend, DeepSpeedBackendConfig) else {}
    return _merge(base, options)


class DeepSpeedBackend:
    """``TrainingBackend`` over a DeepSpeed engine; see the module docstring."""

    def __init__(self, model: PreTrainedModel, config: PolicyTrainerConfig, device: torch.device) -> None:
        deepspeed = require_deepspeed()
        self.module = model
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=deepspeed_config(config, device)
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_factor(config.schedule, config.max_steps))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits of a micro-batch (a packed row or padded rows) through the engine."""
        return self.engine(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits

    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward`` (loss scaling and ZeRO gradient partitioning)."""
        self.engine.backward(loss)

    def step(self) -> float:
        """``engine.step`` (clipping, optimizer) and the schedule; the global gradient norm DeepSpeed measured."""
        self.engine.step()
        self.scheduler.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return float(self.scheduler.get_last_lr()[0])

    def state_tensors(self) -> dict[str, Any]:
        """Consolidated model weights, the optimizer's state dict where DeepSpeed can give one, the schedule."""
        return {
            "model": self.engine.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_tensors(self, tensors: dict[str, Any]) -> None:
        """Load weights, optimizer and schedule state (see the limits in the module docstring)."""
        self.engine.module.load_state_dict(tensors["model"], strict=True)
        if "optimizer" not in tensors:  # weights only (a stage with a fresh optimizer)
            return
        self.optimizer.load_state_dict(tensors["optimizer"])
        self.scheduler.load_state_dict(tensors["scheduler"])

    def export(self, directory: Path) -> dict[str, Path]:
        """``save_pretrained`` of the consolidated weights."""
        self.engine.module.save_pretrained(directory)
        return {p.name: p for p in sorted(directory.iterdir()) if p.is_file()}


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
