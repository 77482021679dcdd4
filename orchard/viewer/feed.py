"""Reading the run's topics from the start, a little more on each call: one group-less consumer per topic.

A topic that does not exist yet is skipped and looked for again on the next read, so a viewer started before the
run's first episode picks its topics up as they appear. Each read stops at the end offsets seen when it began (or
after two empty polls: on Kafka, transaction markers take offsets no record has), so one read is bounded even while
the run keeps producing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from orchard.bus import Bus, BusError, Consumer, Record, TopicPartition, read_until_quiet
from orchard.logging import get_logger

log = get_logger("orchard.viewer.feed")

POLL_RECORDS = 1000
POLL_TIMEOUT_S = 0.5
IDLE_POLLS_AT_END = 2


class BusFeed:
    """The new records of ``topics`` on ``bus``, from the earliest offset on, without a consumer group."""

    def __init__(self, bus: Bus, topics: Sequence[str]) -> None:
        self.bus, self.topics = bus, tuple(topics)
        self._consumers: dict[str, Consumer] = {}

    def read_new(self) -> Iterator[Record]:
        """Every record not read yet, topic by topic, up to each topic's end at the time of the call."""
        self._open_new_topics()
        for topic, consumer in self._consumers.items():
            try:
                ends = self.bus.describe_topic(topic).end_offsets
            except BusError as exc:
                log.warning("topic unreadable", topic=topic, error=str(exc))
                continue
            yield from _until_end(consumer, topic, ends)

    def close(self) -> None:
        """Close every consumer."""
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    def _open_new_topics(self) -> None:
        missing = [topic for topic in self.topics if topic not in self._consumers]
        if not missing:
            return
        existing = set(self.bus.list_topics())
        for topic in missing:
            if topic in existing:
                self._consumers[topic] = self.bus.consumer([topic], group=None, start="earliest")


def _until_end(consumer: Consumer, topic: str, ends: dict[int, int]) -> Iterator[Record]:
    until = {TopicPartition(topic, p): end for p, end in ends.items() if end > 0}
    return read_until_quiet(
        consumer, max_records=POLL_RECORDS, poll_timeout_s=POLL_TIMEOUT_S, idle_polls=IDLE_POLLS_AT_END, until=until
    )
