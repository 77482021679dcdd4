"""``until.scored_by`` on both bus backends: the stage's reader of ``trajectories`` and ``scores`` starts at the stage's
start and knows when it has read them to their end, transaction markers included (Kafka), so a stage neither ends
before a trajectory is scored nor waits forever once all are."""

from __future__ import annotations

import time
from collections.abc import Callable

from consumers.synthetic import synthetic_episode
from consumers.trajectory_records import trajectory_record
from orchard.bus import Bus
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.run.stages import BusProbe
from orchard.topics import SCORES, TRAJECTORIES

CODEC = Codec.default()


def trajectory(run_id: str, episode_id: str) -> bytes:
    episode = synthetic_episode(episode_id, calls=2, seed=3, run_id=run_id)
    record = trajectory_record(
        run_id=run_id, episode_id=episode_id, task_id="t", calls=[c.value for c in episode.calls], outcome=None,
        outcome_fields=None, policy_version=1, timestamp_ms=0,
    )  # fmt: skip
    return CODEC.encode("Trajectory", record)


def score(run_id: str, episode_id: str, scorer: str) -> bytes:
    record = {"run_id": run_id, "episode_id": episode_id, "call_index": 1, "scorer": scorer, "policy_version": 1,
              "score": 0.5, "timestamp": 0}  # fmt: skip
    return CODEC.encode("StepScore", record)


def unscored_when_read(probe: BusProbe, scorers: list[str], since_ms: int) -> list[str]:
    """``probe.unscored`` once it has read both topics to their end (it answers None until then)."""
    deadline = time.monotonic() + 30
    while (answer := probe.unscored(scorers, since_ms)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer is not None, "the topics were never read to their end"
    return answer


def test_a_stage_sees_its_trajectories_scored_through_transactions(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str]
) -> None:
    run_id = unique_name("run")  # the standard topics are shared by the tests on a broker: records name their run
    for topic in (TRAJECTORIES, SCORES):
        bus.create_topic(topic, 4, exist_ok=True)
    with bus.producer() as producer:
        producer.produce(TRAJECTORIES, trajectory(run_id, "earlier"), b"earlier", timestamp_ms=1_000)
    since = int(time.time() * 1000) - 1_000
    txn = bus.transactional_producer(unique_name("tx"))
    for episode_id in ("e1", "e2", "e3"):  # one transaction each, as the assembler writes: a marker after each
        txn.begin()
        txn.produce(TRAJECTORIES, trajectory(run_id, episode_id), episode_id.encode())
        txn.commit()
    txn.begin()
    for episode_id in ("e1", "e2"):
        txn.produce(SCORES, score(run_id, episode_id, "rule"), episode_id.encode())
    txn.produce(SCORES, score("another-run", "e3", "rule"), b"e3")
    txn.commit()
    probe = BusProbe(bus_config, run_id)
    try:
        assert unscored_when_read(probe, ["rule"], since) == ["e3"]
        txn.begin()
        txn.produce(SCORES, score(run_id, "e3", "rule"), b"e3")
        txn.commit()
        assert unscored_when_read(probe, ["rule"], since) == []
    finally:
        probe.close()
        txn.close()
