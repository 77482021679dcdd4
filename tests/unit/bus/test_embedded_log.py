"""The embedded bus's on-disk log: crash safety, torn tails, segments, retention, several writers at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchard.bus import Consumer, TopicPartition
from orchard.bus.embedded import EmbeddedBus
from orchard.bus.embedded.log import INDEX_ENTRY
from orchard.config import EmbeddedBusConfig

WRITER = """
import sys
from orchard.bus.embedded import EmbeddedBus
from orchard.config import EmbeddedBusConfig
bus = EmbeddedBus(EmbeddedBusConfig(path=sys.argv[1], segment_bytes=64 * 1024))
producer = bus.producer()
tag = sys.argv[2]
for i in range(int(sys.argv[3])):
    producer.produce("t", f"{tag}-{i:06d}".encode() + b"x" * 300, partition=0)
    if i % 7 == 6:
        producer.flush()
        print(i, flush=True)
producer.flush()
print("done", flush=True)
"""


def read_all(bus: EmbeddedBus, topic: str = "t", partition: int = 0) -> list[bytes]:
    """Every value of one partition, in offset order, through the public consumer."""
    reader = bus.consumer([topic])
    values: list[bytes] = []
    while batch := reader.poll(max_records=1000, timeout_s=0.05):
        values.extend(r.value for r in batch if r.partition == partition)
    return values


def start_writer(path: Path, tag: str, count: int) -> subprocess.Popen[str]:
    """A separate process appending ``count`` records to partition 0 of topic ``t``."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), tag, str(count)], stdout=subprocess.PIPE, text=True
    )


def test_writer_killed_mid_append_loses_no_acknowledged_record(tmp_path: Path) -> None:
    config = EmbeddedBusConfig(path=tmp_path, segment_bytes=64 * 1024)
    EmbeddedBus(config).create_topic("t", partitions=1)
    writer = start_writer(tmp_path, "w", 1_000_000)
    assert writer.stdout is not None
    acknowledged = -1
    while acknowledged < 300:
        acknowledged = int(writer.stdout.readline())
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=10)

    bus = EmbeddedBus(config)
    values = read_all(bus)
    assert len(values) > acknowledged
    assert [v[:8] for v in values[: acknowledged + 1]] == [f"w-{i:06d}".encode() for i in range(acknowledged + 1)]
    bus.producer().send("t", b"after-crash", partition=0)
    after = read_all(bus)
    assert after[-1] == b"after-crash"
    assert after[:-1] == values


def test_torn_tail_is_truncated_before_the_next_append(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path))
    bus.create_topic("t", partitions=1)
    producer = bus.producer()
    for value in (b"a", b"b", b"c"):
        producer.produce("t", value)
    producer.flush()
    part = tmp_path / "topics" / "t" / "0"
    with open(part / f"{0:020d}.log", "ab") as log_file:  # half a frame, as a dying writer leaves it
        log_file.write(b"\x50\x00\x00\x00garbage")
    with open(part / f"{0:020d}.idx", "ab") as index_file:
        index_file.write(b"\x01\x02\x03")
    assert read_all(bus) == [b"a", b"b", b"c"]
    delivery = producer.send("t", b"d")
    assert delivery.offset == 3
    assert read_all(bus) == [b"a", b"b", b"c", b"d"]
    assert (part / f"{0:020d}.idx").stat().st_size == 4 * INDEX_ENTRY.size


def test_several_processes_append_to_one_partition_without_interleaving_damage(tmp_path: Path) -> None:
    config = EmbeddedBusConfig(path=tmp_path, segment_bytes=64 * 1024)
    bus = EmbeddedBus(config)
    bus.create_topic("t", partitions=1)
    writers = [start_writer(tmp_path, tag, 300) for tag in ("p", "q", "r")]
    for writer in writers:
        writer.communicate(timeout=120)
        assert writer.returncode == 0
    values = read_all(bus)
    assert len(values) == 900
    for tag in ("p", "q", "r"):
        mine = [v[:8] for v in values if v.startswith(tag.encode())]
        assert mine == [f"{tag}-{i:06d}".encode() for i in range(300)]
    assert len(list((tmp_path / "topics" / "t" / "0").glob("*.log"))) > 1


def test_reads_and_timestamp_seeks_cross_segment_boundaries(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))
    bus.create_topic("t", partitions=1)
    producer = bus.producer()
    for i in range(100):
        producer.produce("t", f"{i:03d}".encode() * 100, timestamp_ms=1_000_000 + i)
        producer.flush()
    assert len(list((tmp_path / "topics" / "t" / "0").glob("*.log"))) >= 5
    reader = bus.consumer(["t"])
    reader.seek(TopicPartition("t", 0), 57)
    assert [r.offset for r in reader.poll(max_records=5, timeout_s=0.1)] == [57, 58, 59, 60, 61]
    assert reader.seek_to_timestamp(1_000_042) == {TopicPartition("t", 0): 42}
    assert reader.poll(max_records=1, timeout_s=0.1)[0].value == b"042" * 100
    assert reader.seek_to_timestamp(2_000_000) == {TopicPartition("t", 0): 100}


def test_retention_deletes_old_segments_and_readers_skip_to_the_log_start(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096, retention_ms=60_000))
    bus.create_topic("t", partitions=1)
    producer = bus.producer()
    old = int(time.time() * 1000) - 3_600_000
    for i in range(50):
        producer.produce("t", b"o" * 500, timestamp_ms=old + i)
        producer.flush()
    for _ in range(5):
        producer.produce("t", b"n" * 500)
        producer.flush()
    reader = bus.consumer(["t"])
    assert bus.enforce_retention() > 0
    info = bus.describe_topic("t")
    assert info.start_offsets[0] > 0
    assert info.end_offsets[0] == 55
    values = read_all(bus)
    assert values[-5:] == [b"n" * 500] * 5
    assert len(values) == 55 - info.start_offsets[0]
    assert reader.poll(max_records=1000, timeout_s=0.1)[0].offset == info.start_offsets[0]


def test_bad_directory_fails_at_start_with_the_path_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    from orchard.bus import BusUnavailableError

    with pytest.raises(BusUnavailableError, match=str(blocker)):
        EmbeddedBus(EmbeddedBusConfig(path=blocker))


def test_interrupted_transaction_is_settled_exactly_once_on_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchard.bus.embedded import log as log_module

    config = EmbeddedBusConfig(path=tmp_path)
    bus = EmbeddedBus(config)
    bus.create_topic("in", partitions=1)
    bus.create_topic("out", partitions=2)
    for i in range(4):
        bus.producer().send("in", f"i{i}".encode())
    consumer = bus.consumer(["in"], "g")
    batch = consumer.poll(max_records=10, timeout_s=0.1)
    txn = bus.transactional_producer("tx")
    txn.begin()
    for record in batch:
        txn.produce("out", record.value, partition=0)
        txn.produce("out", record.value, partition=1)
    real_append = log_module.PartitionLog.append_locked
    calls = {"n": 0}

    def dies_on_second_partition(self: log_module.PartitionLog, records: list[log_module.PendingRecord]) -> int:
        calls["n"] += 1
        if calls["n"] == 2:  # the process "dies" after the journal and the first partition were written
            raise KeyboardInterrupt
        return real_append(self, records)

    monkeypatch.setattr(log_module.PartitionLog, "append_locked", dies_on_second_partition)
    with pytest.raises(KeyboardInterrupt):
        txn.commit(consumer)
    monkeypatch.setattr(log_module.PartitionLog, "append_locked", real_append)
    assert list((tmp_path / "transactions").glob("*.journal"))

    reopened = EmbeddedBus(config)
    assert not list((tmp_path / "transactions").glob("*.journal"))
    assert read_all(reopened, "out", 0) == [b"i0", b"i1", b"i2", b"i3"]
    assert read_all(reopened, "out", 1) == [b"i0", b"i1", b"i2", b"i3"]
    assert reopened.group_offsets("g").read() == {TopicPartition("in", 0): 4}
    assert reopened.transactions.settle_all() == 0
    assert sorted(os.listdir(tmp_path / "transactions")) == ["tx.epoch", "tx.lock"]


def test_crc_check_catches_a_damaged_record_when_enabled(tmp_path: Path) -> None:
    from orchard.bus import BusError

    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, verify_crc=True))
    bus.create_topic("t", partitions=1)
    bus.producer().send("t", b"precious value")
    segment = tmp_path / "topics" / "t" / "0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit inside the value, as disk damage would leave it
    segment.write_bytes(bytes(data))
    with pytest.raises(BusError, match="corrupt frame at offset 0"):
        bus.consumer(["t"]).poll(max_records=1, timeout_s=0.1)
    unchecked = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, verify_crc=False))
    assert len(unchecked.consumer(["t"]).poll(max_records=1, timeout_s=0.1)) == 1


def test_orphan_segment_of_a_writer_that_died_mid_roll_is_discarded(tmp_path: Path) -> None:
    from orchard.bus.embedded.log import PendingRecord, encode_frame

    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))
    bus.create_topic("t", partitions=1)
    producer = bus.producer()
    part = tmp_path / "topics" / "t" / "0"
    while sorted(part.glob("*.log"))[-1].stat().st_size < 4096 if list(part.glob("*.log")) else True:
        producer.send("t", b"filler" * 100, partition=0)  # until the next append must roll
    next_base = bus.describe_topic("t").end_offsets[0]
    ghost = tmp_path / "topics" / "t" / "0" / f"{next_base:020d}.log"
    ghost.write_bytes(b"".join(encode_frame(next_base, PendingRecord(None, b"UNACKED-GHOST", 0))))  # no .idx yet

    delivery = producer.send("t", b"acknowledged", partition=0)
    assert delivery.offset == next_base
    reader = bus.consumer(["t"])
    reader.seek(TopicPartition("t", 0), next_base)
    assert [r.value for r in reader.poll(max_records=10, timeout_s=0.1)] == [b"acknowledged"]
    producer.send("t", b"next", partition=0)
    assert read_all(bus)[-2:] == [b"acknowledged", b"next"]


def test_retention_runs_by_itself_when_a_segment_rolls_and_honours_the_topic_setting(tmp_path: Path) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, segment_bytes=4096))
    bus.create_topic("short", partitions=1, config={"retention.ms": "60000"})
    bus.create_topic("forever", partitions=1)
    producer = bus.producer()
    old = int(time.time() * 1000) - 3_600_000
    for topic in ("short", "forever"):
        for i in range(30):
            producer.produce(topic, b"o" * 500, timestamp_ms=old + i)
            producer.flush()
        for _ in range(20):
            producer.produce(topic, b"n" * 500)
            producer.flush()
    assert bus.describe_topic("short").start_offsets[0] > 0
    assert bus.describe_topic("forever").start_offsets[0] == 0


def test_appends_end_offsets_and_reads_at_the_tail_do_not_list_the_partition_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = EmbeddedBus(EmbeddedBusConfig(path=tmp_path))
    bus.create_topic("t", partitions=1)
    producer = bus.producer()
    reader = bus.consumer(["t"])
    producer.send("t", b"first")  # the first append and read list the directory once
    reader.poll(max_records=10, timeout_s=0.01)
    listed: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path: str | os.PathLike[str]) -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", counting_listdir)
    partition = bus.log_for(TopicPartition("t", 0))
    for i in range(100):
        assert producer.send("t", f"r{i}".encode()).offset == i + 1
        assert partition.end_offset() == i + 2
        assert [r.value for r in reader.poll(max_records=10, timeout_s=0.01)] == [f"r{i}".encode()]
    assert reader.poll(max_records=10, timeout_s=0.01) == []
    assert listed == []


def drain(reader: Consumer) -> list[int]:
    """Offsets of everything ``reader`` can read now."""
    offsets: list[int] = []
    while batch := reader.poll(max_records=100, timeout_s=0.01):
        offsets += [r.offset for r in batch]
    return offsets


def test_writers_and_readers_with_stale_segment_caches_follow_another_processs_rolls_and_retention(
    tmp_path: Path,
) -> None:
    config = EmbeddedBusConfig(path=tmp_path, segment_bytes=4096)
    mine, theirs = EmbeddedBus(config), EmbeddedBus(config)  # separate caches, as two processes have
    mine.create_topic("t", partitions=1)
    old = int(time.time() * 1000) - 3_600_000

    def send(bus: EmbeddedBus, value: bytes) -> int:
        offsets: list[int] = []
        producer = bus.producer()
        producer.produce("t", value, partition=0, timestamp_ms=old, on_delivery=lambda d: offsets.append(d.offset))
        producer.flush()
        return offsets[0]

    assert send(mine, b"mine-0") == 0
    reader = mine.consumer(["t"])
    watcher = EmbeddedBus(config).consumer(["t"])  # a third process that only reads
    assert drain(reader) == drain(watcher) == [0]
    partition = mine.log_for(TopicPartition("t", 0))
    assert [send(theirs, b"theirs" * 100) for _ in range(30)] == list(range(1, 31))  # rolling several times
    assert partition.end_offset() == 31
    assert send(mine, b"mine-1") == 31
    assert drain(reader) == drain(watcher) == list(range(1, 32))

    expiring = EmbeddedBus(config.model_copy(update={"retention_ms": 60_000}))
    assert expiring.enforce_retention() > 0  # deletes segments `mine` last listed
    start = expiring.describe_topic("t").start_offsets[0]
    assert partition.start_offset() == start > 0
    assert partition.end_offset() == 32
    assert [send(theirs, b"theirs" * 100) for _ in range(20)] == list(range(32, 52))
    assert send(mine, b"mine-2") == 52
    assert drain(reader) == drain(watcher) == list(range(32, 53))
    late = mine.consumer(["t"])
    assert late.poll(max_records=1, timeout_s=0.01)[0].offset == start
