"""Token-budget batching: several samples per micro-batch, either packed into one row or padded into a batch of rows.

Two layouts (``PolicyTrainerConfig.layout``), the same loss and gradients (tests check both against one sample at a
time):

- **packed**: one optimizer step takes samples in the trainer's order (arrival order on a stream, the pass's order
  on a complete input) until the next one would exceed ``batch_tokens * grad_accum`` tokens; the step's samples are
  sorted by ``Sample.key`` (so their arrival order within the step changes nothing), and first-fit decreasing packs
  them into rows (micro-batches) of at most ``batch_tokens`` tokens each, batch size 1. Each sample's
  ``position_ids`` restart at 0 inside the row, and transformers derives a block-causal mask from restarting
  positions (``masking_utils.find_packed_sequence_indices``, used for SDPA/eager when no attention mask is passed;
  FlashAttention takes the same positions as variable-length sequences), so no token attends across a sample
  boundary. Padding waste is zero by construction, unless ``pad_to_multiple`` asks for steadier shapes (for
  ``torch.compile``), and then the waste is reported. Without variable-length attention (SDPA on a CPU, or on a GPU
  without FlashAttention) a row's attention is computed over the whole row and masked, so it costs the square of the
  row's length.
- **padded**: each sample is a row of its own in a ``[rows, length]`` micro-batch, padded on the right to the
  longest; samples are taken longest first while ``rows * length`` stays within ``batch_tokens``. Causal attention
  already keeps every real token from seeing the padding after it, so no attention mask is needed, and the padding's
  positions carry no loss. Attention costs each sample's own length squared; the padding is the waste.

A sample longer than ``batch_tokens`` gets a micro-batch of its own (the budget is soft for a single sample).

Token alignment: the logits at position ``j`` predict token ``j + 1``, so a row carries, at position ``j``, the
target ``token_ids[j + 1]`` and that token's loss mask, advantage and behaviour logprob. A sample's first token is
never a target (it has no context); its last position has no target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from orchard.tokens import unpack_logprobs, unpack_loss_mask, unpack_token_ids
from trainers.exceptions import InvalidSampleError

SampleKind = Literal["SFT", "RL"]
Layout = Literal["packed", "padded"]


@dataclass(frozen=True)
class Sample:
    """One decoded ``TrainingSample``: its token arrays and what the trainer needs to weigh it."""

    sample_id: str
    kind: SampleKind
    policy_version: int
    token_ids: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8]
    advantages: npt.NDArray[np.float32]
    behaviour_logprobs: npt.NDArray[np.float32] | None
    reward: float
    weight: float = 1.0
    task_id: str = ""
    episode_id: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        """Its place in an order that depends on the samples alone, not on when they arrived."""
        return (self.task_id, self.episode_id, self.sample_id)

    @property
    def num_tokens(self) -> int:
        """Length of the sequence."""
        return int(self.token_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        """Tokens the loss applies to (the first token can never be a target)."""
        return int(self.loss_mask[1:].sum())


def sample_from_record(record: Mapping[str, Any]) -> Sample:
    """Decode the packed arrays of a ``TrainingSample`` record; ``InvalidSampleError`` on inconsistent lengths."""
    sample_id = str(record["sample_id"])
    tokens = unpack_token_ids(record["token_ids"])
    mask = unpack_loss_mask(record["loss_mask"])
    advantages = unpack_logprobs(record["advantages"])
    behaviour = unpack_logprobs(record["behaviour_logprobs"])
    if tokens.shape[0] < 2:
        raise InvalidSampleError(f"sample {sample_id}: {tokens.shape[0]} tokens, at least 2 are needed")
    for name, array in (("loss_mask", mask), ("advantages", advantages)):
        if array.shape != tokens.shape:
            raise InvalidSampleError(
                f"sample {sample_id}: {name} has {array.shape[0]} values for {tokens.shape[0]} tokens"
            )
    if behaviour.shape[0] not in (0, tokens.shape[0]):
        raise InvalidSampleError(
            f"sample {sample_id}: behaviour_logprobs has {behaviour.shape[0]} values for {tokens.shape[0]} tokens"
        )
    return Sample(
        sample_id=sample_id,
        kind=record["kind"],
        policy_version=int(record["policy_version"]),
        token_ids=tokens,
        loss_mask=mask,
        advantages=advantages,
        behaviour_logprobs=behaviour if behaviour.shape[0] else None,
        reward=float(record["reward"]),
        task_id=str(record["task_id"]),
        episode_id=str(record["episode_id"]),
    )


@dataclass
class PackedBatch:
    """One micro-batch: model inputs and per-position loss fields, all ``[rows, T]`` tensors (one row when packed)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    behaviour_logprobs: torch.Tensor
    has_behaviour: torch.Tensor
    is_rl: torch.Tensor
    token_weight: torch.Tensor
    sample_ids: list[str]
    num_tokens: int
    padded_tokens: int

    @property
    def loss_tokens(self) -> int:
        """Positions whose target the loss applies to."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device) -> PackedBatch:
        """The same batch with every tensor on ``device``."""
        moved = {
            name: getattr(self, name).to(device, non_blocking=True)
            for name in ("input_ids", "position_ids", "targets", "loss_mask", "advantages", "behaviour_logprobs")
        }
        moved |= {name: getattr(self, name).to(device) for name in ("has_behaviour", "is_rl", "token_weight")}
        return PackedBatch(
            **moved, sample_ids=self.sample_ids, num_tokens=self.num_tokens, padded_tokens=self.padded_tokens
        )


def plan_rows(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """First-fit decreasing: indices of ``lengths`` grouped into rows of at most ``budget`` tokens.

    Deterministic (ties keep input order); an item longer than ``budget`` gets a row of its own; each row lists its
    indices in input order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[int] = []
    for index in order:
        size = lengths[index]
        slot = next((r for r, free in enumerate(room) if free >= size), None)
        if slot is None:
            rows.append([index])
            room.append(budget - size)
        else:
            rows[slot].append(index)
            room[slot] -= size
    return [sorted(row) for row in rows]


def plan_padded(lengths: Sequence[int], budget: int, pad_to_multiple: int = 1) -> list[list[int]]:
    """Longest first: indices of ``lengths`` grouped into padded micro-batches of at most ``budget`` positions
    (rows times the longest row, rounded up to ``pad_to_multiple``). Deterministic (ties keep input order); an item
    longer than ``budget`` gets a batch of its own; each batch lists its indices longest first."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for index in order:
        width = -(-lengths[batches[-1][0]] // pad_to_multiple) * pad_to_multiple if batches else 0
        if batches and (len(batches[-1]) + 1) * width <= budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


class _Rows:
    """The arrays of a micro-batch being filled, ``[rows, length]``, padding everywhere until a sample is placed."""

    def __init__(self, rows: int, length: int, pad_token_id: int) -> None:
        self.ids = np.full((rows, length), pad_token_id, dtype=np.int64)
        self.targets = np.full((rows, length), pad_token_id, dtype=np.int64)
        self.positions = np.zeros((rows, length), dtype=np.int64)
        self.floats = {name: np.zeros((rows, length), dtype=np.float32)
                       for name in ("mask", "adv", "blp", "has_blp", "rl", "weight")}  # fmt: skip

    def place(self, sample: Sample, row: int, start: int) -> int:
        """Write ``sample`` into ``row`` from ``start`` (positions from 0, loss fields shifted to the targets);
        return where it ends."""
        end = start + sample.num_tokens
        self.ids[row, start:end] = sample.token_ids
        self.targets[row, start : end - 1] = sample.token_ids[1:]
        self.positions[row, start:end] = np.arange(sample.num_tokens)
        span = (row, slice(start, end - 1))
        self.floats["mask"][span] = sample.loss_mask[1:]
        self.floats["adv"][span] = sample.advantages[1:]
        if sample.behaviour_logprobs is not None:
            self.floats["blp"][span] = sample.behaviour_logprobs[1:]
            self.floats["has_blp"][span] = 1.0
        self.floats["rl"][span] = 1.0 if sample.kind == "RL" else 0.0
        self.floats["weight"][span] = sample.weight
        return end

    def batch(self, samples: Sequence[Sample]) -> PackedBatch:
        total = sum(s.num_tokens for s in samples)
        row = {name: torch.from_numpy(array) for name, array in self.floats.items()}
        return PackedBatch(
            input_ids=torch.from_numpy(self.ids),
            position_ids=torch.from_numpy(self.positions),
            targets=torch.from_numpy(self.targets),
            loss_mask=row["mask"],
            advantages=row["adv"],
            behaviour_logprobs=row["blp"],
            has_behaviour=row["has_blp"].bool(),
            is_rl=row["rl"].bool(),
            token_weight=row["weight"],
            sample_ids=[s.sample_id for s in samples],
            num_tokens=total,
            padded_tokens=self.ids.size - total,
        )


def pack_row(samples: Sequence[Sample], pad_token_id: int = 0, pad_to_multiple: int = 1) -> PackedBatch:
    """Concatenate ``samples`` into one row, positions restarting per sample, loss fields shifted to the targets."""
    total = sum(s.num_tokens for s in samples)
    length = -(-total // pad_to_multiple) * pad_to_multiple
    rows = _Rows(1, length, pad_token_id)
    start = 0
    for sample in samples:
        start = rows.place(sample, 0, start)
    rows.positions[0, total:] = np.arange(length - total)  # padding is a sequence of its own: it attends to no sample
    return rows.batch(samples)


def pad_rows(samples: Sequence[Sample], pad_token_id: int = 0, pad_to_multiple: int = 1) -> PackedBatch:
    """One row per sample, padded on the right to the longest (rounded up to ``pad_to_multiple``); a row's positions
    run on through its padding, so it reads as one sequence and no packing is inferred from them."""
    longest = max(s.num_tokens for s in samples)
    length = -(-longest // pad_to_multiple) * pad_to_multiple
    rows = _Rows(len(samples), length, pad_token_id)
    rows.positions[:] = np.arange(length)
    for index, sample in enumerate(samples):
        rows.place(sample, index, 0)
    return rows.batch(samples)


def pack_step(
    samples: Sequence[Sample],
    batch_tokens: int,
    pad_token_id: int = 0,
    pad_to_multiple: int = 1,
    layout: Layout = "packed",
) -> list[PackedBatch]:
    """The micro-batches of one optimizer step: ``samples`` packed into rows of at most ``batch_tokens`` tokens, or
    (``layout="padded"``) padded into batches of at most ``batch_tokens`` positions."""
    lengths = [s.num_tokens for s in samples]
    if layout == "padded":
        return [pad_rows([samples[i] for i in batch], pad_token_id, pad_to_multiple)
                for batch in plan_padded(lengths, batch_tokens, pad_to_multiple)]  # fmt: skip
    rows = plan_rows(lengths, batch_tokens)
    return [pack_row([samples[i] for i in row], pad_token_id, pad_to_multiple) for row in rows]


def padding_waste(batches: Sequence[PackedBatch]) -> float:
    """Fraction of the positions computed that are padding."""
    padded = sum(b.padded_tokens for b in batches)
    total = padded + sum(b.num_tokens for b in batches)
    return padded / total if total else 0.0
