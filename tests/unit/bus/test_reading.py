"""``read_until_quiet`` on the embedded bus: each stopping rule ends the read, and nothing else does."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchard.bus import Bus, Consumer, Record, TopicPartition, open_bus, read_until_quiet
from orchard.config import EmbeddedBusConfig

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)


class Counted:
    """A real consumer whose polls are counted; ``before_poll(n)`` runs before the n-th poll (from 1)."""

    def __init__(self, consumer: Consumer, before_poll: Callable[[int], None] | None = None) -> None:
        self.consumer, self.before_poll, self.polls = consumer, before_poll, 0

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        self.polls += 1
        if self.before_poll is not None:
            self.before_poll(self.polls)
        return self.consumer.poll(max_records, timeout_s)

    def position(self) -> dict[TopicPartition, int]:
        return self.consumer.position()


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic(TOPIC, partitions=1)
        yield bus


def produce(bus: Bus, *values: bytes) -> None:
    with bus.producer() as producer:
        for value in values:
            producer.produce(TOPIC, value, partition=0)


def read(consumer: Counted, **rules: object) -> list[bytes]:
    return [r.value for r in read_until_quiet(consumer, **rules)]  # type: ignore[arg-type]


def test_idle_polls_stops_after_that_many_empty_polls_in_a_row(bus: Bus) -> None:
    produce(bus, b"a", b"b", b"c")
    consumer = Counted(bus.consumer([TOPIC]))

    values = read(consumer, max_records=1, poll_timeout_s=0.01, idle_polls=2)

    assert (values, consumer.polls) == ([b"a", b"b", b"c"], 5)  # three records, then two empty polls


def test_a_record_after_an_empty_poll_starts_the_count_of_empty_polls_again(bus: Bus) -> None:
    produce(bus, b"a")
    late = {3: b"late"}  # written just before the third poll, after one empty poll
    consumer = Counted(bus.consumer([TOPIC]), lambda n: produce(bus, late[n]) if n in late else None)

    values = read(consumer, max_records=10, poll_timeout_s=0.01, idle_polls=2)

    assert (values, consumer.polls) == ([b"a", b"late"], 5)  # a, empty, late, empty, empty


def test_quiet_s_stops_once_no_record_came_for_that_long(bus: Bus) -> None:
    produce(bus, b"a", b"b")
    consumer = Counted(bus.consumer([TOPIC]))
    started = time.monotonic()

    values = read(consumer, max_records=10, poll_timeout_s=0.05, quiet_s=0.3)

    assert values == [b"a", b"b"]
    assert 0.3 <= time.monotonic() - started < 5.0  # empty polls of 0.05 s went on until the quiet time passed


def test_until_stops_as_soon_as_the_position_reaches_the_end_offsets(bus: Bus) -> None:
    produce(bus, b"a", b"b", b"c", b"d", b"e")
    consumer = Counted(bus.consumer([TOPIC]))

    values = read(consumer, max_records=1, poll_timeout_s=0.01, until={TP: 3}, idle_polls=100)

    assert (values, consumer.polls) == ([b"a", b"b", b"c"], 3)  # no empty poll to find out


def test_a_consumer_already_at_the_end_offsets_does_not_poll(bus: Bus) -> None:
    produce(bus, b"a", b"b")
    consumer = Counted(bus.consumer([TOPIC], start="latest"))

    values = read(consumer, max_records=10, poll_timeout_s=1.0, until={TP: 2})

    assert (values, consumer.polls) == ([], 0)


def test_a_partition_missing_from_the_position_has_not_reached_its_end(bus: Bus) -> None:
    produce(bus, b"a")
    consumer = Counted(bus.consumer([TOPIC]))
    elsewhere = TopicPartition("other", 0)  # never assigned to this consumer

    values = read(consumer, max_records=10, poll_timeout_s=0.01, until={TP: 1, elsewhere: 0}, idle_polls=2)

    assert (values, consumer.polls) == ([b"a"], 3)  # ended by the empty polls, not by the end offsets


def test_budget_s_stops_polling_once_the_time_is_spent_including_the_callers(bus: Bus) -> None:
    produce(bus, b"a", b"b", b"c", b"d")
    consumer = Counted(bus.consumer([TOPIC]))
    values = []

    for record in read_until_quiet(consumer, max_records=1, poll_timeout_s=0.01, budget_s=0.3):  # type: ignore[arg-type]
        values.append(record.value)
        time.sleep(0.2)  # the caller's work on a record counts against the budget

    assert (values, consumer.polls) == ([b"a", b"b"], 2)


def test_a_budget_of_zero_reads_nothing(bus: Bus) -> None:
    produce(bus, b"a")
    consumer = Counted(bus.consumer([TOPIC]))

    assert (read(consumer, max_records=10, poll_timeout_s=1.0, budget_s=0.0), consumer.polls) == ([], 0)


def test_max_polls_stops_after_that_many_polls(bus: Bus) -> None:
    produce(bus, b"a", b"b", b"c", b"d", b"e")
    consumer = Counted(bus.consumer([TOPIC]))

    values = read(consumer, max_records=2, poll_timeout_s=0.01, max_polls=2, idle_polls=1)

    assert (values, consumer.polls) == ([b"a", b"b", b"c", b"d"], 2)


def test_the_rules_start_counting_at_the_first_record_asked_for(bus: Bus) -> None:
    produce(bus, b"a")
    consumer = Counted(bus.consumer([TOPIC]))
    records = read_until_quiet(consumer, max_records=10, poll_timeout_s=0.01, budget_s=0.2)  # type: ignore[arg-type]
    time.sleep(0.3)  # longer than the budget, before reading starts

    assert [r.value for r in records] == [b"a"]


def test_a_read_without_a_stopping_rule_is_refused(bus: Bus) -> None:
    with bus.consumer([TOPIC]) as consumer, pytest.raises(ValueError, match="needs a stopping rule"):
        read_until_quiet(consumer, max_records=10, poll_timeout_s=0.01)
