"""Reading a topic to its end and input records back by offset (restoring state) on the embedded bus."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from consumers import runtime
from consumers.runtime import StateRestoreError, TopicReadError, read_offsets, read_topic
from orchard.bus import Bus, Consumer, Record, open_bus
from orchard.config import EmbeddedBusConfig


@pytest.mark.parametrize("gap", [1000, 3])
def test_exactly_the_wanted_records_come_back_across_gaps_and_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gap: int
) -> None:
    monkeypatch.setattr(runtime, "READ_GAP", gap)  # 3: every gap below is read as a range of its own
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic("in", 2)
        producer = bus.producer()
        for partition in (0, 1):
            for offset in range(40):
                producer.produce("in", f"{partition}:{offset}".encode(), partition=partition)
        producer.flush()
        wanted = {0: [3, 4, 20, 39], 1: [0, 10, 11, 12, 38]}
        found = read_offsets(bus, "in", {**wanted, 1: [*wanted[1], 40, 41]}, poll_timeout_s=0.05)
        assert found == {(p, o): f"{p}:{o}".encode() for p, offsets in wanted.items() for o in offsets}


def test_a_held_record_that_does_not_come_back_is_read_again_then_raises_instead_of_being_reported_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    once = runtime._read_offsets_once
    passes: list[int] = []

    def dropping(*args: object, **kwargs: object) -> dict[tuple[int, int], bytes]:
        passes.append(1)
        found = once(*args, **kwargs)  # type: ignore[arg-type]
        found.pop((0, 5), None)  # as if the read had ended before the record arrived
        return found

    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "in", [range(10)])
        monkeypatch.setattr(runtime, "_read_offsets_once", dropping)
        with pytest.raises(StateRestoreError, match=r"1 records in still holds .*\(0, 5\)"):
            read_offsets(bus, "in", {0: [2, 5]}, poll_timeout_s=0.05)
        assert len(passes) == 2
        monkeypatch.setattr(runtime, "_read_offsets_once", once)
        found = read_offsets(bus, "in", {0: [2, 5, 12]}, poll_timeout_s=0.05)  # 12: past the end
        assert found == {(0, 2): b"2", (0, 5): b"5"}


def _fill(bus: Bus, topic: str, values: list[range]) -> None:
    """Create ``topic`` with one partition per entry of ``values`` and write each number there as text."""
    bus.create_topic(topic, len(values))
    producer = bus.producer()
    for partition, numbers in enumerate(values):
        for number in numbers:
            producer.produce(topic, f"{number}".encode(), partition=partition)
    producer.flush()


class _SlowFirstFetch:
    """A consumer whose first ``empty`` polls come back empty, as a Kafka consumer's do while its first fetch waits
    on a busy broker or a rebalance; everything else is the real consumer's."""

    def __init__(self, inner: Consumer, empty: int) -> None:
        self.inner, self.empty = inner, empty

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        if self.empty > 0:
            self.empty -= 1
            time.sleep(timeout_s)
            return []
        return self.inner.poll(max_records, timeout_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _slow_bus(bus: Bus, empty: int) -> Bus:
    """``bus`` whose plain consumers start with ``empty`` empty polls."""
    make = bus.consumer

    def consumer(topics: list[str], group: str | None = None, **kwargs: Any) -> Consumer:
        return _SlowFirstFetch(make(topics, group, **kwargs), empty)  # type: ignore[return-value]

    bus.consumer = consumer  # type: ignore[method-assign]
    return bus


def test_a_read_outwaits_a_slow_first_fetch_instead_of_returning_part_of_the_topic(tmp_path: Path) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(0, 30, 2), range(1, 30, 2)])
        slow = _slow_bus(bus, empty=8)  # 8 empty polls: the old rule gave up after 3
        records = list(read_topic(slow, "changelog", poll_timeout_s=0.01))
        assert sorted(int(r.value) for r in records) == list(range(30))
        found = read_offsets(slow, "changelog", {0: [0, 14], 1: [0, 14]}, poll_timeout_s=0.01)
        assert found == {(0, 0): b"0", (0, 14): b"28", (1, 0): b"1", (1, 14): b"29"}


def test_a_read_that_makes_no_progress_raises_instead_of_returning_part_of_the_topic(tmp_path: Path) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(5)])
        stalled = _slow_bus(bus, empty=10_000)
        started = time.monotonic()
        with pytest.raises(TopicReadError, match=r"changelog made no progress for 0.2s .*\{0: \(0, 5\)\}"):
            list(read_topic(stalled, "changelog", poll_timeout_s=0.01, stall_s=0.2))
        assert time.monotonic() - started < 5


class _OpenTransaction:
    """``bus`` as Kafka shows it while a transaction that wrote its partition 0 is open: readers reach only the
    last stable offset (0 here) and sit there, while the written offsets count the transaction's records. Decided
    ``open_s`` seconds after creation."""

    def __init__(self, bus: Bus, open_s: float, fetch_lag_s: float = 0.0) -> None:
        self.bus, self.decided_at, self.fetch_lag_s = bus, time.monotonic() + open_s, fetch_lag_s

    def is_open(self) -> bool:
        return time.monotonic() < self.decided_at

    def describe_topic(self, name: str) -> Any:
        info = self.bus.describe_topic(name)
        return dataclasses.replace(info, end_offsets=dict.fromkeys(info.end_offsets, 0)) if self.is_open() else info

    def written_offsets(self, name: str) -> dict[int, int]:
        return self.bus.written_offsets(name)

    def consumer(self, topics: list[str], group: str | None = None, **kwargs: Any) -> Consumer:
        return _HeldConsumer(self.bus.consumer(topics, group, **kwargs), self)  # type: ignore[return-value]


class _HeldConsumer:
    """Fetches nothing while the transaction is open and for ``fetch_lag_s`` after (a fetch in flight)."""

    def __init__(self, inner: Consumer, txn: _OpenTransaction) -> None:
        self.inner, self.txn = inner, txn

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        if time.monotonic() < self.txn.decided_at + self.txn.fetch_lag_s:
            time.sleep(timeout_s)
            return []
        return self.inner.poll(max_records, timeout_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_read_to_the_written_end_waits_on_an_open_transaction_past_the_stall_time(tmp_path: Path) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(5)])
        held = _OpenTransaction(bus, open_s=0.8)
        assert list(read_topic(held, "changelog", poll_timeout_s=0.01, stall_s=0.2)) == []  # type: ignore[arg-type]
        started = time.monotonic()
        records = list(read_topic(held, "changelog", poll_timeout_s=0.01, stall_s=0.2, undecided=True))  # type: ignore[arg-type]
        assert [int(r.value) for r in records] == list(range(5))
        assert time.monotonic() - started > 0.2, "nothing was held: the test tested nothing"


def test_a_read_to_the_written_end_still_raises_when_readable_records_do_not_come(tmp_path: Path) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(5), range(3)])
        stalled = _slow_bus(bus, empty=10_000)
        with pytest.raises(TopicReadError, match=r"no progress for 0.2s .*\{0: \(0, 5\)\}\); stopped"):
            list(read_topic(stalled, "changelog", poll_timeout_s=0.01, stall_s=0.2, undecided=True, partitions=[0]))


def test_a_transaction_decided_just_before_the_stall_check_is_not_taken_for_a_stall(tmp_path: Path) -> None:
    """Decided at 0.25 s, its records fetched 0.15 s later: the check at 0.3 s sees the readable end moved."""
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(5)])
        held = _OpenTransaction(bus, open_s=0.25, fetch_lag_s=0.15)
        records = list(read_topic(held, "changelog", poll_timeout_s=0.01, stall_s=0.3, undecided=True))  # type: ignore[arg-type]
        assert [int(r.value) for r in records] == list(range(5))


class _OthersWritten:
    """A consumer that fetches nothing, while the position of partition 1 (written by others) keeps moving."""

    def __init__(self, inner: Consumer) -> None:
        self.inner, self.writes = inner, 0

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        time.sleep(timeout_s)
        return []

    def position(self) -> dict[Any, int]:
        self.writes += 1
        return {tp: at + self.writes if tp.partition == 1 else at for tp, at in self.inner.position().items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("undecided", [False, True])
def test_writes_to_partitions_a_read_does_not_want_do_not_hide_its_stall(tmp_path: Path, undecided: bool) -> None:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        _fill(bus, "changelog", [range(5), range(3)])
        make = bus.consumer
        bus.consumer = lambda *a, **k: _OthersWritten(make(*a, **k))  # type: ignore[method-assign]
        started = time.monotonic()
        with pytest.raises(TopicReadError, match=r"\{0: \(0, 5\)\}"):
            list(read_topic(bus, "changelog", poll_timeout_s=0.01, stall_s=0.2, undecided=undecided, partitions=[0]))
        assert time.monotonic() - started < 5
