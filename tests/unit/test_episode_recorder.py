"""The episode recorder: prefix-delta ModelCalls keyed by episode, and recovery from a failed publish."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchard.bus import RecordTooLargeError
from orchard.bus.embedded import EmbeddedBus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.episode_recorder import EpisodeRecorder
from orchard.prefix_delta import PromptReconstructor


def test_a_failed_publish_does_not_poison_the_calls_after_it(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, max_record_bytes=40_000))
    bus.create_topic("model-calls", partitions=2)
    bus.create_topic("outcomes", partitions=2)
    producer = bus.producer()
    recorder = EpisodeRecorder(producer, run_id="r", episode_id="e1", task_id="t", harness="h", model="m")
    prompts = [np.arange(100), np.arange(6_000), np.arange(6_000 + 40)]
    messages: list[dict[str, str]] = [{"role": "user", "content": "go"}]

    def call(prompt: np.ndarray) -> int:
        return recorder.record_call(
            messages=messages, prompt_ids=prompt, completion_ids=np.arange(20), logprobs=np.zeros(20),
            response_text="ok", policy_version=1,
        )  # fmt: skip

    assert call(prompts[0]) == 0
    with pytest.raises(RecordTooLargeError):
        call(np.arange(30_000))  # too big for the bus: it is refused, and its index is used up
    assert call(prompts[1]) == 2
    assert call(prompts[2]) == 3
    recorder.record_outcome(status="FAILED", reward=0.0, group_id="g")
    producer.flush()

    codec, rebuilt = Codec.default(), PromptReconstructor()
    records = [codec.decode(r.value).record for r in bus.consumer(["model-calls"]).poll(100, 0.1)]
    assert [r["call_index"] for r in records] == [0, 2, 3]
    for record, prompt in zip(records, [prompts[0], prompts[1], prompts[2]], strict=True):
        assert np.array_equal(rebuilt.add_model_call(record), prompt)
    [outcome] = [codec.decode(r.value).record for r in bus.consumer(["outcomes"]).poll(10, 0.1)]
    assert (outcome["num_model_calls"], outcome["status"], outcome["success"]) == (3, "FAILED", False)
