"""What the policy trainer trains, shared by every backend: the device, the precision, the starting weights and
tokenizer, and the learning-rate schedule.

The backends that hold the model, its optimizer and scheduler are in ``trainers.backends``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import transformers
from packaging.version import Version
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from trainers.config import CheckpointModelSource, ScheduleConfig, TinyModelSource
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
