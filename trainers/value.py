"""The value model: a small causal LM with a scalar head that predicts whether an episode succeeds.

Its input is a trajectory's token sequence as the policy saw it: the prompt and completion of the episode's last
model call (whose prompt already holds the whole conversation), truncated from the left to ``max_length`` so the
end of the episode (the final edits, the last test run) is always kept. Its output is one logit; ``sigmoid`` of it
is P(success). It is trained with binary cross-entropy on finished episodes (``Trajectory.success``, or the reward
clipped to [0, 1] as a soft label), and ranks candidate solutions of a task (``trainers.rerank``).

Departures from a textbook value head, and why:

- the pooled state is the hidden state of the *last* real token (sequences are right-padded, so causal attention
  keeps padding out of it); ``pooling="mean"`` averages all real tokens instead;
- the head starts at zero, so an untrained model says 0.5 for everything rather than a random preference;
- the backbone is any Hugging Face causal LM checkpoint (its LM head is dropped) or a member of the built-in tiny
  family, built from its config; a published value model is a directory of its own (``config.json``,
  ``model.safetensors``, ``orchard_value.json``, tokenizer files) that ``ValueModel.load`` reads back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from orchard.engines.tiny import build_tiny_tokenizer, is_tiny_name, tiny_model_config
from orchard.logging import get_logger
from orchard.trajectory import Trajectory

log = get_logger("trainers.value")

VALUE_INFO_FILE = "orchard_value.json"
"""Marks a directory as a saved value model and holds its own settings (max length, pooling)."""
WEIGHTS_FILE = "model.safetensors"
TokenIds = npt.NDArray[np.int64]
Pooling = Literal["last", "mean"]


class ValueModelConfig(BaseModel):
    """Which backbone the value model starts from, and how it reads a trajectory."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "tiny-llama",
        min_length=1,
        description="A tiny-family name, a checkpoint directory, or policy:NAME (the value trainer's run's newest "
        "published version of policy NAME).",
    )
    seed: int = Field(0, description="Seed of a tiny backbone's weights and of the head.")
    max_length: int = Field(1024, ge=8, description="Tokens kept from the end of the trajectory.")
    pooling: Pooling = Field("last", description="'last': the last real token's state; 'mean': all tokens'.")


@dataclass(frozen=True, slots=True)
class ValueExample:
    """One training example: a token sequence and its label in [0, 1]."""

    tokens: TokenIds
    label: float


def trajectory_tokens(trajectory: Trajectory, max_length: int) -> TokenIds:
    """The last call's prompt + completion, truncated from the left to ``max_length`` tokens.

    Raises ``ValueError`` for a trajectory without model calls (there is nothing to judge).
    """
    if not trajectory.steps:
        raise ValueError(f"trajectory of episode {trajectory.episode_id!r} has no model calls")
    last = max(trajectory.steps, key=lambda step: step.call_index)
    return np.asarray(last.sequence[-max_length:], dtype=np.int64)


def trajectory_label(trajectory: Trajectory, label: Literal["success", "reward"] = "success") -> float:
    """The training target of a finished trajectory: 1.0/0.0 from ``success``, or the reward clipped to [0, 1]."""
    if label == "success":
        return 1.0 if trajectory.success else 0.0
    return float(min(1.0, max(0.0, trajectory.reward)))


def pad_batch(sequences: Sequence[npt.ArrayLike], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``sequences`` into ``input_ids`` and ``attention_mask`` tensors (every sequence non-empty)."""
    arrays = [np.asarray(seq, dtype=np.int64) for seq in sequences]
    if not arrays or any(array.size == 0 for array in arrays):
        raise ValueError("a batch needs at least one sequence and every sequence at least one token")
    width = max(array.size for array in arrays)
    input_ids = torch.full((len(arrays), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(arrays), width), dtype=torch.long)
    for row, array in enumerate(arrays):
        input_ids[row, : array.size] = torch.from_numpy(array)
        mask[row, : array.size] = 1
    return input_ids, mask


class ValueModel(nn.Module):
    """A causal LM backbone with a scalar head; ``forward`` returns one success logit per sequence."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        *,
        max_length: int,
        pooling: Pooling = "last",
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.max_length = max_length
        self.pooling: Pooling = pooling
        self.tokenizer = tokenizer
        pad = getattr(backbone.config, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else 0
        self.vocab_size = int(backbone.config.vocab_size)

    @classmethod
    def build(cls, config: ValueModelConfig) -> ValueModel:
        """A fresh value model on the configured backbone (a saved value model directory is loaded as it is)."""
        path = Path(config.model)
        if not is_tiny_name(config.model) and (path / VALUE_INFO_FILE).is_file():
            return cls.load(path)
        with torch.random.fork_rng(devices=[]):  # the caller's RNG stays as it was
            torch.manual_seed(config.seed)
            if is_tiny_name(config.model):
                tokenizer: PreTrainedTokenizerBase | None = build_tiny_tokenizer()
                backbone = AutoModel.from_config(tiny_model_config(config.model, tokenizer))
            elif path.is_dir():
                backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
                tokenizer = _tokenizer_if_any(path)
            else:
                raise ValueError(f"value model {config.model!r} is neither a tiny-family name nor a directory")
            model = cls(backbone, max_length=config.max_length, pooling=config.pooling, tokenizer=tokenizer)
        log.info("value model built", model=config.model, parameters=sum(p.numel() for p in model.parameters()))
        return model

    @classmethod
    def load(cls, directory: Path | str) -> ValueModel:
        """Read a value model saved by ``save`` (or downloaded from the store)."""
        path = Path(directory)
        info = json.loads((path / VALUE_INFO_FILE).read_text())
        backbone = AutoModel.from_config(AutoConfig.from_pretrained(path))
        model = cls(backbone, max_length=int(info["max_length"]), pooling=info["pooling"], tokenizer=None)
        model.load_state_dict(load_file(path / WEIGHTS_FILE), strict=True)
        model.tokenizer = _tokenizer_if_any(path)
        return model.eval()

    def save(self, directory: Path | str) -> dict[str, Path]:
        """Write the model (weights, backbone config, settings, tokenizer) into ``directory``; return its files."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().contiguous() for name, tensor in self.state_dict().items()}
        save_file(state, path / WEIGHTS_FILE, metadata={"format": "pt"})
        self.backbone.config.to_json_file(path / "config.json")
        info = {"max_length": self.max_length, "pooling": self.pooling, "architecture": type(self.backbone).__name__}
        (path / VALUE_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(path)
        return {file.name: file for file in sorted(path.iterdir()) if file.is_file()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Success logits, shape ``(batch,)``, for right-padded ``input_ids``."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "mean":
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        else:
            last = attention_mask.sum(dim=1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return self.head(pooled.to(self.head.weight.dtype)).squeeze(-1)

    def logits(self, sequences: Sequence[npt.ArrayLike]) -> torch.Tensor:
        """Logits of token sequences (each truncated from the left to ``max_length``), with gradients."""
        clipped = [np.asarray(seq, dtype=np.int64)[-self.max_length :] for seq in sequences]
        self._check_tokens(clipped)
        device = self.head.weight.device
        input_ids, mask = pad_batch(clipped, self.pad_id)
        return self(input_ids.to(device), mask.to(device))

    @torch.no_grad()
    def predict(self, sequences: Sequence[npt.ArrayLike], batch_size: int = 16) -> npt.NDArray[np.float64]:
        """P(success) of each sequence, in eval mode and without gradients."""
        was_training = self.training
        self.eval()
        try:
            parts = [
                torch.sigmoid(self.logits(sequences[start : start + batch_size])).double().cpu().numpy()
                for start in range(0, len(sequences), batch_size)
            ]
        finally:
            self.train(was_training)
        return np.concatenate(parts) if parts else np.zeros(0)

    def encode_text(self, text: str) -> TokenIds:
        """Token ids of ``text`` (a final patch, a transcript) with the model's tokenizer, last ``max_length`` kept."""
        if self.tokenizer is None:
            raise ValueError("this value model has no tokenizer; score token sequences or trajectories instead")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise ValueError("cannot score an empty text")
        return np.asarray(ids[-self.max_length :], dtype=np.int64)

    def encode_trajectory(self, trajectory: Trajectory) -> TokenIds:
        """The trajectory's token sequence as this model reads it."""
        return trajectory_tokens(trajectory, self.max_length)

    def _check_tokens(self, sequences: Iterable[TokenIds]) -> None:
        for index, seq in enumerate(sequences):
            if seq.size and (int(seq.min()) < 0 or int(seq.max()) >= self.vocab_size):
                raise ValueError(
                    f"sequence {index} has token ids outside the value model's vocabulary [0, {self.vocab_size})"
                )


def _tokenizer_if_any(path: Path) -> PreTrainedTokenizerBase | None:
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(path)


def bce_step(
    model: ValueModel, optimizer: torch.optim.Optimizer, batch: Sequence[ValueExample], max_grad_norm: float = 1.0
) -> float:
    """One optimizer step of binary cross-entropy on ``batch``; returns the loss before the step."""
    model.train()
    logits = model.logits([example.tokens for example in batch])
    labels = torch.tensor([example.label for example in batch], dtype=logits.dtype, device=logits.device)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return float(loss.detach())


def roc_auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """Area under the ROC curve: P(a random positive scores above a random negative), ties counting half.

    >>> roc_auc([0.9, 0.8, 0.1], [1, 0, 0])
    1.0
    >>> roc_auc([0.5, 0.5], [1, 0])
    0.5
    """
    positives = [s for s, y in zip(scores, labels, strict=True) if y >= 0.5]
    negatives = [s for s, y in zip(scores, labels, strict=True) if y < 0.5]
    if not positives or not negatives:
        raise ValueError("AUC needs at least one positive and one negative example")
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return float(wins / (len(positives) * len(negatives)))


def fit(
    model: ValueModel,
    examples: Sequence[ValueExample],
    *,
    epochs: int = 1,
    batch_size: int = 16,
    learning_rate: float = 3e-4,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """Train on ``examples`` for ``epochs`` (shuffled each epoch with ``seed``); return the loss of each step.

    The offline path (a fixed set, e.g. exported trajectories); ``ValueTrainer`` is the streaming one.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    order = np.random.default_rng(seed)
    losses = []
    for _ in range(epochs):
        indices = order.permutation(len(examples))
        for start in range(0, len(indices), batch_size):
            batch = [examples[i] for i in indices[start : start + batch_size]]
            losses.append(bce_step(model, optimizer, batch, max_grad_norm))
    return losses
