"""When a consumer counts as caught up (the condition of ``--idle-exit`` and of idle time passing as event time):
a partition read to its end is, one whose group offset an open transaction holds is not, and a partition nothing
was fetched from counts from where the group left it, clamped to what retention kept."""

from __future__ import annotations

from typing import Any

import pytest

from consumers.reward_consumer import RewardConsumer
from consumers.rewards import FunctionReward
from consumers.runtime import ConsumerRuntime
from orchard.bus.base import TopicInfo, TopicPartition
from orchard.bus.exceptions import BusError

TP = TopicPartition("t", 0)


class Bus:
    """Only ``describe_topic``: one partition with these first and next offsets."""

    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end

    def describe_topic(self, topic: str) -> TopicInfo:
        return TopicInfo(topic, 1, {0: self.start}, {0: self.end})


class Consumer:
    """A consumer assigned ``TP``: its position (None: nothing fetched) and the group's committed offset (None:
    none; ``"held"``: the fetch times out, an open transaction holds it)."""

    def __init__(self, position: int | None, committed: int | str | None) -> None:
        self._position, self._committed = position, committed
        self.committed_calls = 0

    def assignment(self) -> list[TopicPartition]:
        return [TP]

    def position(self) -> dict[TopicPartition, int]:
        return {} if self._position is None else {TP: self._position}

    def committed(self, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        self.committed_calls += 1
        assert timeout_s is not None, "an idle check must not wait out the bus's retry policy"
        if self._committed == "held":
            raise BusError("cannot read the committed offsets: Local: Timed out")
        return {} if self._committed is None else {TP: int(self._committed)}


def caught_up(bus: Bus, consumer: Consumer) -> bool:
    runtime = ConsumerRuntime(bus, RewardConsumer(FunctionReward(lambda s, t: 1.0, name="one")))  # type: ignore[arg-type]
    return runtime._caught_up(consumer)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "end", "position", "committed", "expected"),
    [
        (0, 10, 10, None, True),  # read to the end
        (0, 10, 9, None, True),  # up to a commit marker, which is never returned
        (0, 10, 5, None, False),  # records left
        (0, 10, None, "held", False),  # a dead member's transaction holds the offset: its records are to come
        (0, 10, None, 10, True),  # restarted at the end: nothing fetched, the group's offset says where it is
        (0, 10, None, 9, False),  # nothing fetched and one record left: no slack without a position
        (0, 10, None, None, False),  # a new group on a partition with records
        (5, 5, None, None, True),  # retention emptied it: nothing to read, whatever the group's offset
        (8, 10, 3, None, False),  # below what retention kept: read from the first kept record
        (10, 10, 3, None, True),  # below an emptied log
    ],
)
def test_caught_up(start: int, end: int, position: int | None, committed: Any, expected: bool) -> None:
    assert caught_up(Bus(start, end), Consumer(position, committed)) is expected


def test_a_partition_with_a_position_asks_nothing_of_the_group() -> None:
    consumer = Consumer(10, "held")
    assert caught_up(Bus(0, 10), consumer)
    assert consumer.committed_calls == 0
