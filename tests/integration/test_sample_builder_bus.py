"""The sample builder through the consumer runtime on the embedded bus: recorded episodes -> assembler ->
sample builder (with scores on the bus) -> TrainingSamples; a second run resumes from the changelog and completes
the groups the first left open, with no sample lost or doubled."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from consumers.assembler import TrajectoryAssembler
from consumers.config import RuntimeConfig
from consumers.runtime import ConsumerRuntime, read_topic
from consumers.samples import SampleBuilder, SampleBuilderConfig
from consumers.synthetic import SyntheticEpisode, synthetic_episode
from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.tokens import unpack_array

CODEC = Codec.default()
CONFIG = SampleBuilderConfig(
    kinds=["RL", "SFT"], group_size=4, scorers={"prm": 0.5}, score_wait_ms=60_000, score_settle_ms=500
)
# small batches, one poll per transaction: many transactions
RUNTIME = RuntimeConfig(max_poll_records=7, poll_timeout_s=0.2, transaction_interval_s=0)


def _episodes() -> list[SyntheticEpisode]:
    """Two groups of four three-call episodes; rewards alternate 1, 0 within each group."""
    return [
        synthetic_episode(
            f"{group}-{i}",
            calls=3,
            seed=i,
            group_id=group,
            reward=float(i % 2 == 0),
            first_prompt_tokens=12,
            completion_tokens=4,
            tool_output_tokens=3,
        )  # fmt: skip
        for group in ("gA", "gB")
        for i in range(4)
    ]


def _publish(bus: Bus, namespace: str, episodes: Sequence[SyntheticEpisode]) -> None:
    for topic in ("model-calls", "outcomes", "scores"):
        bus.create_topic(f"{namespace}.{topic}", 4, exist_ok=True)
    producer = bus.producer()
    for episode in episodes:
        for record in episode.records:
            producer.produce(f"{namespace}.{record.topic}", record.value, record.key)
        for call in range(3):
            score = {"run_id": "synthetic", "episode_id": episode.episode_id, "call_index": call, "scorer": "prm",
                     "policy_version": 1, "score": 0.1 * call, "timestamp": 0}  # fmt: skip
            producer.produce(f"{namespace}.scores", CODEC.encode("StepScore", score), episode.episode_id.encode())
    producer.flush()
    producer.close()


def _run_pipeline(bus: Bus, namespace: str) -> None:
    for processor in (TrajectoryAssembler(), SampleBuilder(CONFIG)):
        runtime = ConsumerRuntime(bus, processor, namespace=namespace, instance_id="test", config=RUNTIME)
        runtime.run(idle_exit_s=1.0)


def _samples(bus: Bus, namespace: str) -> list[dict]:
    records = read_topic(bus, f"{namespace}.samples", poll_timeout_s=0.3)
    return [CODEC.decode(record.value).record for record in records]


def _comparable(samples: list[dict]) -> list[tuple]:
    """Samples by id, without ``created_at`` (event time of the close, which depends on when records were sent)."""
    return sorted(tuple((k, v) for k, v in sorted(s.items()) if k != "created_at") for s in samples)


def test_the_sample_builder_turns_recorded_episodes_into_samples_and_resumes_from_its_changelog(
    tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus", session_timeout_ms=2000))
    try:
        episodes = _episodes()
        whole, split = unique_name("sb"), unique_name("sb")
        _publish(bus, whole, episodes)
        _run_pipeline(bus, whole)
        reference = _samples(bus, whole)

        # every episode gives one RL and one SFT sample (one conversation); ids are unique
        assert sorted(s["sample_id"] for s in reference) == sorted(
            f"{e.episode_id}/{kind}/c0/0-2" for e in episodes for kind in ("RL", "SFT")
        )
        for sample in reference:
            mask = unpack_array(sample["loss_mask"], "uint8")
            values = unpack_array(sample["advantages"], "float32")
            assert int(mask.sum()) == 12  # three calls of four generated tokens each
            assert not values[mask == 0].any()
            if sample["kind"] == "RL":  # +-1 outcome advantage, plus 0.5 * 0.1 * call index per call's tokens
                outcome = 1.0 if sample["reward"] == 1.0 else -1.0
                expected = sorted([outcome + 0.05 * call for call in range(3)] * 4)
                assert np.allclose(sorted(values[mask == 1]), expected, atol=1e-4)

        # the same episodes in two halves, each half processed by a fresh runtime and processor: the second
        # restores the open groups and waiting trajectories from the changelog and completes them
        _publish(bus, split, [e for e in episodes if e.episode_id in ("gA-0", "gA-1", "gB-0")])
        _run_pipeline(bus, split)
        assert _samples(bus, split) == []  # no group is full yet
        _publish(bus, split, [e for e in episodes if e.episode_id not in ("gA-0", "gA-1", "gB-0")])
        _run_pipeline(bus, split)
        assert _comparable(_samples(bus, split)) == _comparable(reference)
    finally:
        bus.close()
