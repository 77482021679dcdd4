"""Synthetic recorded episodes for tests and benchmarks: real ``ModelCall``/``EpisodeOutcome`` records, prefix-delta
encoded by the ``EpisodeRecorder`` exactly as the recording proxy publishes them, captured instead of sent.

Each episode is one growing agent conversation: a system + task prompt, then per call a completion and a tool
result appended to the context, so call *k*'s prompt is call *k-1*'s whole sequence plus the tool output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchard.bus.base import DeliveryCallback, Producer
from orchard.episode_recorder import EpisodeRecorder, EpisodeStatus
from orchard.topics import MODEL_CALLS, OUTCOMES


@dataclass(frozen=True, slots=True)
class CapturedRecord:
    """One record an ``EpisodeRecorder`` would have sent."""

    topic: str
    key: bytes | None
    value: bytes


class CapturingProducer(Producer):
    """A producer that only collects what is produced (in order)."""

    def __init__(self) -> None:
        """Start empty; no size limit."""
        super().__init__(1 << 40)
        self.records: list[CapturedRecord] = []

    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Keep the record."""
        self.records.append(CapturedRecord(topic, key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing to wait for."""

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True, slots=True)
class SyntheticEpisode:
    """One episode's records: its calls in call order and its outcome."""

    episode_id: str
    calls: list[CapturedRecord]
    outcome: CapturedRecord

    @property
    def records(self) -> list[CapturedRecord]:
        """Calls then outcome, the order the proxy and the env publish them."""
        return [*self.calls, self.outcome]


def synthetic_episode(
    episode_id: str,
    *,
    calls: int = 30,
    seed: int = 0,
    first_prompt_tokens: int = 1000,
    completion_tokens: int = 120,
    tool_output_tokens: int = 150,
    run_id: str = "synthetic",
    task_id: str | None = None,
    group_id: str | None = None,
    policy_version: int = 1,
    reward: float | None = None,
) -> SyntheticEpisode:
    """Record one episode of ``calls`` model calls (see the module docstring) and its outcome."""
    rng = np.random.default_rng(seed)
    producer = CapturingProducer()
    task = task_id or f"task-{seed % 7}"
    recorder = EpisodeRecorder(
        producer, run_id=run_id, episode_id=episode_id, task_id=task, harness="synthetic", model="tiny"
    )
    context = rng.integers(0, 50_000, first_prompt_tokens, dtype=np.int32)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": _words(rng, first_prompt_tokens // 4)},
    ]
    for index in range(calls):
        completion = rng.integers(0, 50_000, completion_tokens, dtype=np.int32)
        text = f"step {index}: " + _words(rng, completion_tokens // 2)
        arguments = json.dumps({"cmd": f"pytest -k t{index}"})
        tool_call = [{"id": f"call_{index}", "type": "function", "function": {"name": "shell", "arguments": arguments}}]
        recorder.record_call(
            messages=messages, prompt_ids=context, completion_ids=completion,
            logprobs=-rng.exponential(0.5, completion_tokens).astype(np.float32), response_text=text,
            policy_version=policy_version, tool_calls=tool_call, finish_reason="tool_calls", latency_ms=100.0,
        )  # fmt: skip
        tool_output = rng.integers(0, 50_000, tool_output_tokens, dtype=np.int32)
        context = np.concatenate([context, completion, tool_output])
        messages = [
            *messages,
            {"role": "assistant", "content": text, "tool_calls": tool_call},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": _words(rng, tool_output_tokens // 2)},
        ]
    score = reward if reward is not None else float(seed % 2)
    status: EpisodeStatus = "SUCCEEDED" if score > 0.5 else "FAILED"
    recorder.record_outcome(
        status=status, reward=score, group_id=group_id or f"group-{task}", policy_version=policy_version,
        signals={"tests_passed_fraction": score},
    )  # fmt: skip
    *call_records, outcome = producer.records
    if [r.topic for r in call_records] != [MODEL_CALLS] * calls or outcome.topic != OUTCOMES:
        raise RuntimeError("the episode recorder published something other than the calls and the outcome")
    return SyntheticEpisode(episode_id, call_records, outcome)


def interleaved(episodes: list[SyntheticEpisode], window: int = 8, seed: int = 0) -> list[CapturedRecord]:
    """The episodes' records in overlapping waves of ``window`` episodes, shuffled within each wave (so calls
    arrive out of order and after their outcome, as they do from many concurrent episodes)."""
    rng = np.random.default_rng(seed)
    out: list[CapturedRecord] = []
    for start in range(0, len(episodes), window):
        wave = [record for episode in episodes[start : start + window] for record in episode.records]
        out += [wave[i] for i in rng.permutation(len(wave))]
    return out


def _words(rng: np.random.Generator, count: int) -> str:
    return " ".join(f"w{w}" for w in rng.integers(0, 5000, count))
