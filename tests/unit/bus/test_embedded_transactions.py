"""Embedded transactions and groups under faults: fencing, failed commits, lost partitions, raising callbacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.bus import TopicPartition, TransactionError
from orchard.bus.embedded import EmbeddedBus
from orchard.bus.embedded import log as log_module
from orchard.bus.embedded import transactions as txn_module
from orchard.bus.embedded.consumer import EmbeddedConsumer
from orchard.bus.embedded.frames import PendingRecord
from orchard.bus.embedded.locks import write_atomic
from orchard.bus.exceptions import BusError, TransactionPendingError
from orchard.config import EmbeddedBusConfig


def values(bus: EmbeddedBus, topic: str) -> list[bytes]:
    """Every value of ``topic`` in partition then offset order."""
    reader = bus.consumer([topic])
    out: list[bytes] = []
    while batch := reader.poll(max_records=1000, timeout_s=0.05):
        out.extend(r.value for r in batch)
    return sorted(out)


@pytest.fixture
def bus(tmp_path: Path) -> EmbeddedBus:
    """A bus with an input topic of four records over two partitions and an empty output topic."""
    opened = EmbeddedBus(EmbeddedBusConfig(path=tmp_path, session_timeout_ms=5000))
    opened.create_topic("in", partitions=2)
    opened.create_topic("out", partitions=2)
    producer = opened.producer()
    for i in range(4):
        producer.produce("in", f"i{i}".encode(), partition=i % 2)
    producer.flush()
    return opened


def transform(
    bus: EmbeddedBus, consumer: EmbeddedConsumer, transactional_id: str = "tx", producer: object | None = None
) -> None:
    """One consume-transform-produce transaction over everything ``consumer`` can read now."""
    producer = producer or bus.transactional_producer(transactional_id)
    producer.begin()  # type: ignore[attr-defined]
    for record in consumer.poll(max_records=100, timeout_s=0.1):
        producer.produce("out", record.value + b"|out", partition=record.partition)  # type: ignore[attr-defined]
    producer.commit(consumer)  # type: ignore[attr-defined]


def test_a_newer_producer_with_the_same_id_fences_the_old_one(bus: EmbeddedBus) -> None:
    old = bus.transactional_producer("worker")
    bus.transactional_producer("worker")
    old.begin()
    old.produce("out", b"stale")
    with pytest.raises(TransactionError, match="fenced"):
        old.commit()
    assert values(bus, "out") == []


def test_a_journal_that_cannot_be_written_leaves_nothing_and_a_retry_commits_once(
    bus: EmbeddedBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer = bus.consumer(["in"], "g")
    producer = bus.transactional_producer("tx")
    real = txn_module.write_atomic

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(txn_module, "write_atomic", disk_full)
    with pytest.raises(TransactionError, match="not committed"):
        transform(bus, consumer, producer=producer)
    assert values(bus, "out") == []
    assert bus.group_offsets("g").read() == {}
    assert consumer.position() == {TopicPartition("in", 0): 0, TopicPartition("in", 1): 0}
    monkeypatch.setattr(txn_module, "write_atomic", real)
    transform(bus, consumer, producer=producer)
    assert values(bus, "out") == [b"i0|out", b"i1|out", b"i2|out", b"i3|out"]
    assert not list(bus.root.joinpath("transactions").glob("*.journal"))


def test_a_transient_apply_failure_is_retried_in_place_without_duplicates(
    bus: EmbeddedBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = log_module.PartitionLog.append_locked
    calls = {"n": 0}

    def flaky(self: log_module.PartitionLog, records: list[log_module.PendingRecord]) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(self, records)

    monkeypatch.setattr(log_module.PartitionLog, "append_locked", flaky)
    transform(bus, bus.consumer(["in"], "g"))
    assert values(bus, "out") == [b"i0|out", b"i1|out", b"i2|out", b"i3|out"]
    assert bus.group_offsets("g").read() == {TopicPartition("in", 0): 2, TopicPartition("in", 1): 2}


def test_a_persistent_apply_failure_is_pending_and_completed_exactly_once_by_the_next_open(
    bus: EmbeddedBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = log_module.PartitionLog.append_locked
    calls = {"n": 0}

    def broken_after_first(self: log_module.PartitionLog, records: list[log_module.PendingRecord]) -> int:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(5, "Input/output error")
        return real(self, records)

    monkeypatch.setattr(log_module.PartitionLog, "append_locked", broken_after_first)
    with pytest.raises(TransactionPendingError, match="completed by the next open"):
        transform(bus, bus.consumer(["in"], "g"))
    monkeypatch.setattr(log_module.PartitionLog, "append_locked", real)
    reopened = EmbeddedBus(bus.config)
    assert values(reopened, "out") == [b"i0|out", b"i1|out", b"i2|out", b"i3|out"]
    assert reopened.group_offsets("g").read() == {TopicPartition("in", 0): 2, TopicPartition("in", 1): 2}


def test_a_member_that_lost_partitions_mid_transaction_aborts_and_rewinds(bus: EmbeddedBus) -> None:
    first = bus.consumer(["in"], "g", instance_id="a")
    batch = first.poll(max_records=100, timeout_s=0.1)
    assert len(batch) == 4
    producer = bus.transactional_producer("tx-a")
    producer.begin()
    for record in batch:
        producer.produce("out", record.value + b"|out")
    second = bus.consumer(["in"], "g", instance_id="b")  # joins and takes its share at once
    with pytest.raises(TransactionError, match="reassigned"):
        producer.commit(first)
    assert values(bus, "out") == []
    assert first.position() == {TopicPartition("in", 0): 0}
    transform(bus, second, "tx-b")
    transform(bus, first, "tx-a")
    assert values(bus, "out") == [b"i0|out", b"i1|out", b"i2|out", b"i3|out"]


def test_a_member_that_lost_a_partition_cannot_overwrite_its_new_owners_commit(bus: EmbeddedBus) -> None:
    first = bus.consumer(["in"], "g", instance_id="a")
    assert len(first.poll(max_records=100, timeout_s=0.1)) == 4
    second = bus.consumer(["in"], "g", instance_id="b")
    assert [r.offset for r in second.poll(max_records=100, timeout_s=0.1)] == [0, 1]
    second.commit()
    first.commit()
    assert bus.group_offsets("g").read() == {TopicPartition("in", 0): 2, TopicPartition("in", 1): 2}


def test_a_raising_delivery_callback_does_not_keep_other_records_from_being_written(bus: EmbeddedBus) -> None:
    producer = bus.producer()

    def explode(_: object) -> None:
        raise RuntimeError("callback bug")

    producer.produce("out", b"a", partition=0, on_delivery=explode)
    producer.produce("out", b"b", partition=1)
    with pytest.raises(RuntimeError, match="callback bug"):
        producer.flush()
    assert values(bus, "out") == [b"a", b"b"]


def test_a_journal_written_in_pieces_decodes_to_the_same_transaction(tmp_path: Path) -> None:
    tp, other = TopicPartition("t", 0), TopicPartition("u", 3)
    records = {
        tp: [PendingRecord(b"k", b"v" * 70_000, 5, 9), PendingRecord(None, b"", 6, 9)],
        other: [PendingRecord(b"", b"x", 7, 9)],
    }
    journal = txn_module.Journal(9, "g", {tp: 2}, records, {tp: 0, other: 4})
    path = tmp_path / "j.journal"
    write_atomic(path, journal.pieces(), fsync=True)
    assert path.read_bytes() == journal.encode()
    assert txn_module.Journal.decode(path.read_bytes()) == journal


@pytest.mark.parametrize("cut", [-1, 1])  # one byte short, one byte too many
def test_a_damaged_journal_stops_the_bus_from_opening_naming_it_instead_of_applying_part_of_it(
    bus: EmbeddedBus, cut: int
) -> None:
    tp = TopicPartition("out", 0)
    records = {tp: [PendingRecord(b"k", b"value", 5, 9)]}
    data = txn_module.Journal(9, None, {}, records, {tp: 0}).encode()
    path = bus.root / "transactions" / "p.1.journal"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data[:cut] if cut < 0 else data + b"x")
    with pytest.raises(BusError, match=r"p\.1\.journal: transaction journal of \d+ bytes where its header accounts"):
        EmbeddedBus(bus.config)
    path.unlink()  # moved aside, as the error says: the bus opens without that transaction
    assert values(EmbeddedBus(bus.config), "out") == []
