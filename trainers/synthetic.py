"""Synthetic ``TrainingSample`` records for tests, benchmarks and demos of the trainers (deterministic from a seed).

Each sample is a random token sequence: a prompt (loss mask 0) followed by a completion (loss mask 1). SFT samples
carry a credit weight in ``advantages`` (1.0, or 0.5 on the second half of the completion: a partially productive
attempt); RL samples carry one advantage per sample (group-relative style, +-1 scaled) and behaviour logprobs near
those of a fresh model (``-log(vocab)``, with noise), so importance ratios start close to 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

from orchard.bus import Bus
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.tokens import pack_logprobs, pack_loss_mask, pack_token_ids


def synthetic_sample(
    index: int,
    *,
    run_id: str = "default",
    kind: Literal["SFT", "RL"] = "RL",
    vocab_size: int = 1000,
    length: int = 64,
    policy_version: int = 0,
    seed: int = 0,
) -> dict[str, Any]:
    """One ``TrainingSample`` record (a dict for ``Codec.encode``), the same for the same arguments."""
    rng = np.random.default_rng([seed, index])
    tokens = rng.integers(3, vocab_size, size=length, dtype=np.int32)
    prompt = max(1, length // 3)
    mask = np.zeros(length, dtype=np.uint8)
    mask[prompt:] = 1
    advantages = np.zeros(length, dtype=np.float32)
    behaviour = np.zeros(length, dtype=np.float32)
    if kind == "SFT":
        advantages[prompt:] = 1.0
        advantages[prompt + (length - prompt) // 2 :] = 0.5
    else:
        advantages[prompt:] = (1.0 if index % 2 == 0 else -1.0) * float(rng.uniform(0.5, 1.5))
        noise = rng.normal(0.0, 0.1, size=length - prompt)
        behaviour[prompt:] = (-math.log(vocab_size) + noise).astype(np.float32)
    return {
        "run_id": run_id,
        "episode_id": f"episode-{seed}-{index}",
        "task_id": f"task-{index % 7}",
        "group_id": f"group-{index // 4}",
        "sample_id": f"sample-{seed}-{index}",
        "kind": kind,
        "policy_version": policy_version,
        "token_ids": pack_token_ids(tokens),
        "loss_mask": pack_loss_mask(mask),
        "advantages": pack_logprobs(advantages),
        "behaviour_logprobs": pack_logprobs(behaviour) if kind == "RL" else b"",
        "reward": float(advantages[-1] > 0),
        "created_at": now_ms(),
    }


def synthetic_stream(
    count: int,
    *,
    run_id: str = "default",
    kinds: Sequence[Literal["SFT", "RL"]] = ("RL",),
    vocab_size: int = 1000,
    lengths: Sequence[int] = (48, 64, 96, 128),
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``count`` samples cycling through ``kinds`` and ``lengths``."""
    return [
        synthetic_sample(
            i,
            run_id=run_id,
            kind=kinds[i % len(kinds)],
            vocab_size=vocab_size,
            length=lengths[i % len(lengths)],
            seed=seed,
        )
        for i in range(count)
    ]


def produce_samples(
    bus: Bus, topic: str, records: Iterable[dict[str, Any]], *, partitions: int = 1, codec: Codec | None = None
) -> int:
    """Create ``topic`` (if absent) and produce ``records`` to it in order, keyed by episode; return the count."""
    codec = codec or Codec.default()
    bus.create_topic(topic, partitions, exist_ok=True)
    count = 0
    with bus.producer() as producer:
        for record in records:
            producer.produce(topic, codec.encode("TrainingSample", record), key=record["episode_id"].encode())
            count += 1
        producer.flush()
    return count
