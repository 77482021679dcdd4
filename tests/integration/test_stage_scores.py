"""``until.scored_by`` on both bus backends: the stage's reader of ``trajectories`` and ``scores`` starts at the stage's
start and knows when it has read them to their end, transaction markers included (Kafka), so a stage neither ends
before a trajectory is scored nor waits forever once all are."""

from __future__ import annotations

import time
from collections.abc import Callable

from consumers.synthetic import synthetic_episode
from orchard.bus import Bus
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.run.stages import BusProbe
from orchard.topics import SCORES, TRAJECTORIES
from orchard.trajectory_records import trajectory_record

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


def caught_up_within(probe: BusProbe, group: str, wanted: bool, timeout_s: float) -> bool:
    """Ask ``probe.caught_up`` until it answers ``wanted`` (or the timeout); return its last answer."""
    deadline = time.monotonic() + timeout_s
    while (answer := probe.caught_up(group)) != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return answer


def test_a_group_is_caught_up_once_it_committed_past_every_record_of_its_topics(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str]
) -> None:
    """``until.caught_up``: a consume-transform-produce group (a sample builder) that has committed past the last
    record of each partition, transaction markers of its input not waited for (Kafka), and not before."""
    source, sink, group = unique_name("trajectories"), unique_name("samples"), unique_name("builder")
    bus.create_topic(source, 2)
    bus.create_topic(sink, 2)
    writer = bus.transactional_producer(unique_name("assembler"))
    for index in range(4):  # one transaction each, as the assembler writes: a marker after each on Kafka
        writer.begin()
        writer.produce(source, f"t{index}".encode(), f"k{index}".encode())
        writer.commit()
    probe = BusProbe(bus_config, "run")
    builder = bus.consumer([source], group)
    transform = bus.transactional_producer(unique_name("builder-tx"))
    try:
        assert caught_up_within(probe, group, True, 1.0) is False  # it has committed nothing
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:
            for record in builder.poll(max_records=1, timeout_s=0.5):
                seen.append(record.value)
                transform.begin()
                transform.produce(sink, record.value + b"|sample")
                transform.commit(builder)
                if len(seen) == 2:
                    assert caught_up_within(probe, group, True, 1.0) is False  # two records still to process
        assert sorted(seen) == [b"t0", b"t1", b"t2", b"t3"]
        assert caught_up_within(probe, group, True, 30.0) is True
        assert bus.committed_offsets(group) == builder.committed()  # read without joining: nobody else assigned
        writer.begin()
        writer.produce(source, b"t4", b"k4")
        writer.commit()
        assert caught_up_within(probe, group, False, 30.0) is False  # a record it has not processed yet
        assert bus.committed_offsets(unique_name("never-ran")) == {}
    finally:
        builder.close()
        transform.close()
        writer.close()
        probe.close()
