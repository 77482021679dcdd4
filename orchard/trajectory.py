"""The assembled trajectory: one episode's model calls, in order and with full prompts, joined with its outcome.

This is the in-memory form every downstream consumer (reward plug-ins, credit assignment, the sample builder,
the value trainer) works with. The assembler builds it from ``ModelCall`` and ``EpisodeOutcome`` records;
``Step.from_model_call`` resolves the prefix-delta encoding so each step carries its whole prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from orchard.prefix_delta import PromptReconstructor
from orchard.tokens import unpack_logprobs, unpack_token_ids

TokenIds = npt.NDArray[np.int32]
Logprobs = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Step:
    """One model call of an episode, with its full (prefix-resolved) prompt."""

    call_index: int
    conversation_id: int
    policy_version: int
    prompt_token_ids: TokenIds
    completion_token_ids: TokenIds
    completion_logprobs: Logprobs
    request_messages: list[Any]
    response_text: str
    response_tool_calls: list[Any]
    finish_reason: str
    retokenized: bool = False

    @property
    def sequence(self) -> TokenIds:
        """Prompt followed by completion."""
        return np.concatenate([self.prompt_token_ids, self.completion_token_ids])


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One episode: its steps in call order and its outcome (absent when ``complete`` is False).

    An incomplete trajectory is emitted when its outcome or some of its calls never arrived in time;
    ``incomplete_reason`` says which. Consumers decide whether to train on it (the sample builder does not).
    """

    run_id: str
    episode_id: str
    task_id: str
    group_id: str
    steps: tuple[Step, ...]
    status: str | None = None  # EpisodeOutcome.status symbol, e.g. "SUCCEEDED"; None without an outcome
    reward: float = 0.0
    success: bool = False
    signals: Mapping[str, float] = field(default_factory=dict)
    policy_version: int | None = None
    complete: bool = True
    incomplete_reason: str | None = None

    @property
    def oldest_policy_version(self) -> int | None:
        """The oldest policy version among the steps (what staleness limits compare against)."""
        return min((step.policy_version for step in self.steps), default=self.policy_version)


def steps_from_model_calls(records: Iterable[Mapping[str, Any]]) -> tuple[Step, ...]:
    """Resolve decoded ``ModelCall`` records of one episode (any order) into steps sorted by ``call_index``."""
    ordered = sorted(records, key=lambda record: record["call_index"])
    reconstructor = PromptReconstructor()
    steps = []
    for record in ordered:
        prompt = reconstructor.add_model_call(record)
        steps.append(
            Step(
                call_index=record["call_index"],
                conversation_id=record.get("conversation_id", 0),
                policy_version=record["policy_version"],
                prompt_token_ids=np.array(prompt, dtype=np.int32),
                completion_token_ids=unpack_token_ids(record["completion_token_ids"]).copy(),
                completion_logprobs=unpack_logprobs(record["completion_logprobs"]).copy(),
                request_messages=reconstructor.messages(record["call_index"]),
                response_text=record["response_text"],
                response_tool_calls=json.loads(record["response_tool_calls_json"]),
                finish_reason=record["finish_reason"],
                retokenized=record.get("retokenized", False),
            )
        )
    return tuple(steps)


def trajectory_from_records(
    calls: Sequence[Mapping[str, Any]],
    outcome: Mapping[str, Any] | None,
    *,
    incomplete_reason: str | None = None,
) -> Trajectory:
    """Build a trajectory from decoded ``ModelCall`` records and the decoded ``EpisodeOutcome`` (or None)."""
    source = outcome if outcome is not None else (calls[0] if calls else None)
    if source is None:
        raise ValueError("a trajectory needs at least one model call or an outcome")
    return Trajectory(
        run_id=source["run_id"],
        episode_id=source["episode_id"],
        task_id=source["task_id"],
        group_id=outcome["group_id"] if outcome is not None else "",
        steps=steps_from_model_calls(calls),
        status=outcome["status"] if outcome is not None else None,
        reward=float(outcome["reward"]) if outcome is not None else 0.0,
        success=bool(outcome["success"]) if outcome is not None else False,
        signals=dict(outcome.get("signals", {})) if outcome is not None else {},
        policy_version=outcome.get("policy_version") if outcome is not None else None,
        complete=incomplete_reason is None and outcome is not None,
        incomplete_reason=incomplete_reason if incomplete_reason is not None or outcome is not None else "no outcome",
    )
