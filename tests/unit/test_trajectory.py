"""Trajectories rebuilt from recorded ModelCall records: full prompts, call order, outcome fields."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchard.bus.embedded import EmbeddedBus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.episode_recorder import EpisodeRecorder
from orchard.trajectory import trajectory_from_records


def _recorded_episode(tmp_path: Path) -> tuple[list[dict], dict, list[np.ndarray]]:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path))
    bus.create_topic("model-calls", partitions=1)
    bus.create_topic("outcomes", partitions=1)
    producer = bus.producer()
    recorder = EpisodeRecorder(producer, run_id="r", episode_id="e", task_id="t", harness="h", model="m")
    messages: list[dict] = [{"role": "user", "content": "fix it"}]
    prompts = [np.arange(10), np.concatenate([np.arange(10), np.arange(50, 55), np.arange(90, 93)])]
    completions = [np.arange(50, 55), np.arange(60, 64)]
    for turn, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        recorder.record_call(
            messages=messages, prompt_ids=prompt, completion_ids=completion,
            logprobs=-np.arange(len(completion), dtype=np.float32), response_text=f"turn {turn}",
            policy_version=3 + turn, tool_calls=[{"id": f"c{turn}", "type": "function"}] if turn == 0 else [],
        )  # fmt: skip
        messages = [*messages, {"role": "assistant", "content": f"turn {turn}"}, {"role": "tool", "content": "ok"}]
    recorder.record_outcome(status="FAILED", reward=0.25, group_id="g", signals={"tests_passed_fraction": 0.5})
    producer.flush()
    codec = Codec.default()
    calls = [codec.decode(r.value).record for r in bus.consumer(["model-calls"]).poll(100, 0.1)]
    [outcome] = [codec.decode(r.value).record for r in bus.consumer(["outcomes"]).poll(10, 0.1)]
    bus.close()
    return calls, outcome, prompts


def test_steps_carry_full_prompts_in_call_order_whatever_the_arrival_order(tmp_path: Path) -> None:
    calls, outcome, prompts = _recorded_episode(tmp_path)
    trajectory = trajectory_from_records(list(reversed(calls)), outcome)
    assert [step.call_index for step in trajectory.steps] == [0, 1]
    for step, prompt in zip(trajectory.steps, prompts, strict=True):
        assert np.array_equal(step.prompt_token_ids, prompt)
    assert np.array_equal(trajectory.steps[1].completion_token_ids, np.arange(60, 64))
    assert trajectory.steps[0].completion_logprobs.tolist() == [0.0, -1.0, -2.0, -3.0, -4.0]
    assert trajectory.steps[1].request_messages[-1] == {"role": "tool", "content": "ok"}
    assert trajectory.steps[0].response_tool_calls == [{"id": "c0", "type": "function"}]
    assert json.dumps(trajectory.steps[0].request_messages)  # plain JSON values


def test_outcome_fields_and_oldest_policy_version(tmp_path: Path) -> None:
    calls, outcome, _ = _recorded_episode(tmp_path)
    trajectory = trajectory_from_records(calls, outcome)
    identity = (trajectory.status, trajectory.reward, trajectory.success, trajectory.group_id)
    assert identity == ("FAILED", 0.25, False, "g")
    assert trajectory.signals == {"tests_passed_fraction": 0.5}
    assert trajectory.complete and trajectory.incomplete_reason is None
    assert trajectory.oldest_policy_version == 3


def test_a_trajectory_without_outcome_is_incomplete_with_a_reason(tmp_path: Path) -> None:
    calls, _, _ = _recorded_episode(tmp_path)
    trajectory = trajectory_from_records(calls, None)
    assert not trajectory.complete
    assert trajectory.incomplete_reason == "no outcome"
    timed_out = trajectory_from_records(calls, None, incomplete_reason="outcome did not arrive within 600 s")
    assert timed_out.incomplete_reason == "outcome did not arrive within 600 s"


def test_nothing_to_build_from_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one model call or an outcome"):
        trajectory_from_records([], None)
