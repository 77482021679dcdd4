"""One conformance suite for every bus backend: the embedded log and a real Apache Kafka broker."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchard.bus import (
    Bus,
    BusError,
    Consumer,
    Record,
    RecordTooLargeError,
    TopicExistsError,
    TopicNotFoundError,
    TopicPartition,
)
from orchard.bus.base import partition_for_key
from orchard.config import BusConfig

WORKER = Path(__file__).with_name("bus_worker.py")


def drain(consumer: Consumer, expected: int, timeout_s: float = 30.0) -> list[Record]:
    """Poll until ``expected`` records arrived (or the timeout), then once more to catch extras."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < expected and time.monotonic() < deadline:
        records.extend(consumer.poll(max_records=500, timeout_s=0.5))
    records.extend(consumer.poll(max_records=500, timeout_s=0.5))
    return records


def wait_for_assignment(consumers: list[Consumer], total: int, timeout_s: float = 30.0) -> None:
    """Poll every consumer until their assignments together cover ``total`` partitions without overlap."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(max_records=1, timeout_s=0.1)
        owned = [tp for c in consumers for tp in c.assignment()]
        if len(owned) == total and len(set(owned)) == total and all(c.assignment() for c in consumers):
            return
    raise AssertionError(f"assignment never settled: {[c.assignment() for c in consumers]}")


def test_topics_are_created_listed_and_described(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name = unique_name("topic")
    bus.create_topic(name, partitions=3)
    assert name in bus.list_topics()
    info = bus.describe_topic(name)
    assert (info.name, info.partitions, info.end_offsets) == (name, 3, {0: 0, 1: 0, 2: 0})
    with pytest.raises(TopicExistsError):
        bus.create_topic(name, partitions=3)
    bus.create_topic(name, partitions=3, exist_ok=True)


def test_missing_topic_is_a_clear_error_for_producers_and_consumers(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    missing = unique_name("missing")
    with pytest.raises(TopicNotFoundError, match=missing):
        bus.producer().produce(missing, b"x")
    with pytest.raises(TopicNotFoundError, match=missing):
        bus.consumer([missing], "g")
    with pytest.raises(TopicNotFoundError):
        bus.describe_topic(missing)


def test_send_confirms_delivery_and_keys_choose_the_partition(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name = unique_name("keyed")
    bus.create_topic(name, partitions=4)
    producer = bus.producer()
    deliveries = [producer.send(name, f"v{i}".encode(), key=b"episode-7") for i in range(5)]
    assert [d.partition for d in deliveries] == [partition_for_key(b"episode-7", 4)] * 5
    assert [d.offset for d in deliveries] == [0, 1, 2, 3, 4]
    assert all(d.error is None for d in deliveries)
    records = drain(bus.consumer([name]), 5)
    assert [r.value for r in records] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert {r.key for r in records} == {b"episode-7"}


def test_oversized_record_is_refused_before_sending_with_the_limit_named(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    name = unique_name("big")
    bus.create_topic(name, partitions=1)
    producer = bus.producer()
    limit = producer.max_record_bytes
    with pytest.raises(RecordTooLargeError, match=f"limit of {limit} bytes"):
        producer.produce(name, b"x" * (limit + 1))
    producer.flush()
    assert bus.describe_topic(name).end_offsets == {0: 0}


def test_a_topics_own_size_limit_is_enforced_before_sending(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name = unique_name("small")
    bus.create_topic(name, partitions=1, config={"max.message.bytes": "20000"})
    producer = bus.producer()
    with pytest.raises(RecordTooLargeError, match="limit of 19872 bytes .topic max.message.bytes=20000"):
        producer.produce(name, b"x" * 19_873)
    producer.send(name, b"x" * 19_872)
    assert bus.describe_topic(name).end_offsets == {0: 1}


def test_group_members_share_partitions_and_resume_from_commits(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name, group = unique_name("shared"), unique_name("group")
    bus.create_topic(name, partitions=4)
    producer = bus.producer()
    for i in range(40):
        producer.produce(name, f"r{i}".encode(), key=f"k{i}".encode())
    producer.flush()
    first, second = bus.consumer([name], group), bus.consumer([name], group)
    wait_for_assignment([first, second], total=4)
    assert set(first.assignment()).isdisjoint(second.assignment())
    first.close()
    second.close()

    reader = bus.consumer([name], group)
    seen = drain(reader, 40)
    assert sorted(r.value for r in seen) == sorted(f"r{i}".encode() for i in range(40))
    reader.commit()
    reader.close()
    for i in range(40, 45):
        producer.produce(name, f"r{i}".encode(), key=f"k{i}".encode())
    producer.flush()
    resumed = bus.consumer([name], group)
    rest = drain(resumed, 5)
    assert sorted(r.value for r in rest) == sorted(f"r{i}".encode() for i in range(40, 45))
    resumed.close()


def test_seek_by_offset_and_by_timestamp(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name = unique_name("seek")
    bus.create_topic(name, partitions=1)
    producer = bus.producer()
    base = int(time.time() * 1000) - 100_000
    for i in range(10):
        producer.produce(name, f"m{i}".encode(), timestamp_ms=base + i * 1000)
    producer.flush()
    reader = bus.consumer([name])
    assert len(drain(reader, 10)) == 10
    reader.seek(TopicPartition(name, 0), 7)
    assert [r.value for r in drain(reader, 3)] == [b"m7", b"m8", b"m9"]
    assert reader.seek_to_timestamp(base + 4500) == {TopicPartition(name, 0): 5}
    replay = drain(reader, 5)
    assert [r.value for r in replay] == [b"m5", b"m6", b"m7", b"m8", b"m9"]
    assert [r.timestamp_ms for r in replay] == [base + i * 1000 for i in range(5, 10)]
    reader.close()


def test_transaction_makes_records_and_offsets_visible_together(bus: Bus, unique_name: Callable[[str], str]) -> None:
    source, sink, group = unique_name("src"), unique_name("sink"), unique_name("txg")
    bus.create_topic(source, partitions=2)
    bus.create_topic(sink, partitions=2)
    producer = bus.producer()
    for i in range(6):
        producer.produce(source, f"in{i}".encode())
    producer.flush()
    consumer = bus.consumer([source], group)
    batch = drain(consumer, 6)
    txn = bus.transactional_producer(unique_name("txid"))
    txn.begin()
    txn.produce(sink, b"aborted")
    txn.abort()
    txn.begin()
    for record in batch:
        txn.produce(sink, record.value + b"|out")
    txn.commit(consumer)
    assert consumer.committed() == consumer.position()
    assert sum(consumer.committed().values()) == 6
    consumer.close()
    out = drain(bus.consumer([sink]), 6)
    assert sorted(r.value for r in out) == sorted(f"in{i}|out".encode() for i in range(6))


def test_written_offsets_count_an_open_transactions_records_and_end_offsets_do_not(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    sink = unique_name("sink")
    bus.create_topic(sink, partitions=1)
    txn = bus.transactional_producer(unique_name("txid"))
    txn.begin()
    for _ in range(3):
        txn.produce(sink, b"pending", partition=0)
    # Kafka writes a transaction's records as they are sent; the embedded log writes them at its commit
    pending = 3 if type(bus).__name__ == "KafkaBus" else 0
    deadline = time.monotonic() + 30
    while bus.written_offsets(sink)[0] < pending:
        assert time.monotonic() < deadline, "the open transaction's records never reached the log"
        time.sleep(0.05)
    assert bus.written_offsets(sink)[0] == pending
    assert bus.describe_topic(sink).end_offsets[0] == 0, "a reader could reach records of an open transaction"
    txn.commit()
    while bus.describe_topic(sink).end_offsets != bus.written_offsets(sink):  # Kafka: until its commit marker
        assert time.monotonic() < deadline, "the committed transaction's records never became readable"
        time.sleep(0.05)
    assert bus.describe_topic(sink).end_offsets[0] >= 3
    txn.close()


def run_worker(config: BusConfig, source: str, sink: str, group: str, mode: str, delay: float) -> subprocess.Popen[str]:
    """Start ``bus_worker.py`` in its own process."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), config.model_dump_json(), source, sink, group, mode, str(delay)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["transactional", "plain"])
def test_worker_killed_mid_batch_resumes_without_loss(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], mode: str
) -> None:
    """kill -9 mid-batch, restart: nothing lost; through transactions nothing duplicated either."""
    source, sink, group = unique_name("src"), unique_name("sink"), unique_name("kill")
    bus.create_topic(source, partitions=2)
    bus.create_topic(sink, partitions=2)
    producer = bus.producer()
    total = 120
    for i in range(total):
        producer.produce(source, f"in{i:04d}".encode(), key=f"k{i}".encode())
    producer.flush()

    victim = run_worker(bus_config, source, sink, group, mode, delay=0.01)
    assert victim.stdout is not None
    commits = 0
    while commits < 3:  # let a few batches commit, then kill inside a later one
        line = victim.stdout.readline()
        assert line, "worker exited before it was killed"
        commits += line.startswith("committed")
    time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)

    survivor = run_worker(bus_config, source, sink, group, mode, delay=0.0)
    survivor.communicate(timeout=120)
    assert survivor.returncode == 0

    out = drain(bus.consumer([sink]), total)
    values = [r.value.decode() for r in out]
    expected = {f"in{i:04d}|out" for i in range(total)}
    assert set(values) == expected
    if mode == "transactional":
        assert sorted(values) == sorted(expected)


def test_a_group_member_seeks_within_its_assignment(bus: Bus, unique_name: Callable[[str], str]) -> None:
    name, group = unique_name("gseek"), unique_name("group")
    bus.create_topic(name, partitions=1)
    producer = bus.producer()
    for i in range(8):
        producer.produce(name, f"m{i}".encode())
    producer.flush()
    member = bus.consumer([name], group)
    assert [r.value for r in drain(member, 8)][:2] == [b"m0", b"m1"]
    member.seek(TopicPartition(name, 0), 5)
    assert [r.value for r in drain(member, 3)] == [b"m5", b"m6", b"m7"]
    member.commit()
    assert member.committed() == {TopicPartition(name, 0): 8}
    member.close()


def produce_timed(bus: Bus, topic: str, base_ms: int, indices: range, partitions: int = 2) -> None:
    """Records ``m<i>`` with timestamps ``base_ms + i * 1000``, spread over the partitions."""
    producer = bus.producer()
    for i in indices:
        producer.produce(topic, f"m{i}".encode(), partition=i % partitions, timestamp_ms=base_ms + i * 1000)
    producer.flush()


def values(records: list[Record]) -> list[bytes]:
    return sorted(r.value for r in records)


def test_a_new_group_starts_at_its_start_position_and_a_committed_offset_wins(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    name = unique_name("start")
    bus.create_topic(name, partitions=2)
    base = int(time.time() * 1000) - 100_000
    produce_timed(bus, name, base, range(10))

    with bus.consumer([name], unique_name("earliest"), start="earliest") as earliest:
        assert values(drain(earliest, 10)) == sorted(f"m{i}".encode() for i in range(10))
    timed = bus.consumer([name], group := unique_name("timed"), start=base + 4500)
    assert values(drain(timed, 5)) == [b"m5", b"m6", b"m7", b"m8", b"m9"]
    timed.commit()
    timed.close()
    produce_timed(bus, name, base, range(10, 12))
    for start in ("earliest", base):  # the group has committed offsets: its start position no longer matters
        with bus.consumer([name], group, start=start) as resumed:
            assert values(drain(resumed, 2)) == [b"m10", b"m11"]

    latest = bus.consumer([name], unique_name("latest"), start="latest")
    wait_for_assignment([latest], total=2)
    produce_timed(bus, name, base, range(12, 14))
    assert values(drain(latest, 2)) == [b"m12", b"m13"]
    latest.close()


def test_a_group_started_after_every_record_reads_only_what_comes_later(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    """The stage-start case: a consumer group that first starts at time T skips the backlog before T, and misses
    nothing produced from T on, even a record that arrives before the group's first assignment."""
    name = unique_name("stage")
    bus.create_topic(name, partitions=2)
    base = int(time.time() * 1000) - 100_000
    produce_timed(bus, name, base, range(6))
    stage_start = base + 6000
    produce_timed(bus, name, base, range(6, 7))  # after the stage began, before its consumer exists
    consumer = bus.consumer([name], unique_name("scorer"), start=stage_start)
    produce_timed(bus, name, base, range(7, 9))

    assert values(drain(consumer, 3)) == [b"m6", b"m7", b"m8"]
    consumer.close()


def test_a_reader_without_a_group_starts_at_a_time_on_every_partition(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    name = unique_name("tread")
    bus.create_topic(name, partitions=3)
    base = int(time.time() * 1000) - 100_000
    produce_timed(bus, name, base, range(9), partitions=3)

    with bus.consumer([name], start=base + 2500) as reader:
        assert values(drain(reader, 6)) == [f"m{i}".encode() for i in range(3, 9)]
    with bus.consumer([name], start=base + 60_000) as reader:  # after every record: the partitions' ends
        assert drain(reader, 0, timeout_s=1.0) == []
        produce_timed(bus, name, base, range(60, 61), partitions=3)
        assert values(drain(reader, 1)) == [b"m60"]


@pytest.mark.parametrize("start", [-1, True, "middle", 1.5])
def test_an_invalid_start_position_is_refused(bus: Bus, unique_name: Callable[[str], str], start: object) -> None:
    name = unique_name("bad")
    bus.create_topic(name, partitions=1)
    with pytest.raises(BusError, match="consumer start"):
        bus.consumer([name], unique_name("g"), start=start)  # type: ignore[arg-type]
