"""The bus interface: keyed produce with delivery confirmation, consumer groups, seeks, topics, transactions.

Two backends implement it (``embedded`` and ``kafka``); one conformance suite runs against both.
Semantics the rest of Orchard relies on, and nothing more:

- a topic has a fixed number of partitions; records in a partition have dense, increasing offsets;
- a record's partition is chosen by the hash of its key (same key, same partition), or round-robin when keyless;
- a consumer group shares the partitions of its topics among its members; committed offsets are the next
  offset to read, so a restarted member resumes exactly after the last committed record;
- a partition the group has no committed offset for (every partition, without a group) is read from the consumer's
  start position: its first record (``earliest``), its end (``latest``), or its first record whose timestamp is at
  or after a time in milliseconds since the epoch (its end when there is none);
- a transactional producer makes its records and its consumer's offsets visible together, or not at all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchard.bus.exceptions import BusError, MemberFencedError, RecordTooLargeError

StartPosition = Literal["earliest", "latest"] | int
"""Where a consumer starts reading a partition without a committed offset: ``earliest``, ``latest``, or a timestamp
(milliseconds since the epoch): the first record at or after it."""
TOPIC_MAX_BYTES = "max.message.bytes"
RECORD_OVERHEAD_BYTES = 128  # record batch and record headers that Kafka counts against max.message.bytes


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """A record as read from the bus."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes

    @property
    def topic_partition(self) -> TopicPartition:
        """The partition this record was read from."""
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class Delivery:
    """Confirmation (or failure) of one produced record."""

    topic: str
    partition: int
    offset: int
    error: str | None = None


DeliveryCallback = Callable[[Delivery], None]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's partitions and, per partition, its first and next offsets."""

    name: str
    partitions: int
    start_offsets: dict[int, int] = field(default_factory=dict)
    end_offsets: dict[int, int] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)

    @property
    def record_count(self) -> int:
        """Records currently held (end minus start, summed over partitions)."""
        return sum(self.end_offsets[p] - self.start_offsets.get(p, 0) for p in self.end_offsets)


class Producer(ABC):
    """Sends records; ``flush`` waits for every queued record to be acknowledged or raises ``DeliveryError``."""

    def __init__(self, max_record_bytes: int) -> None:
        self.max_record_bytes = max_record_bytes
        self._limits: dict[str, tuple[int, str]] = {}

    def topic_max_bytes(self, topic: str) -> int | None:
        """The topic's own ``max.message.bytes`` if it has one (backends override); None: no topic limit."""
        return None

    def record_limit(self, topic: str) -> tuple[int, str]:
        """Largest key + value accepted for ``topic``, and where that limit comes from (cached per topic)."""
        if topic not in self._limits:
            limit, source = self.max_record_bytes, "bus.max_record_bytes"
            topic_bytes = self.topic_max_bytes(topic)
            if topic_bytes is not None and topic_bytes - RECORD_OVERHEAD_BYTES < limit:
                limit = topic_bytes - RECORD_OVERHEAD_BYTES
                source = f"topic max.message.bytes={topic_bytes} less {RECORD_OVERHEAD_BYTES} bytes of framing"
            self._limits[topic] = (limit, source)
        return self._limits[topic]

    def check_size(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Raise ``RecordTooLargeError`` naming the limit, before anything is sent."""
        size = len(value) + (len(key) if key else 0)
        limit, source = self.record_limit(topic)
        if size > limit:
            raise RecordTooLargeError(
                f"record for topic {topic!r} is {size} bytes, over the limit of {limit} bytes ({source})"
            )

    @abstractmethod
    def produce(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Queue one record; its delivery is confirmed through ``on_delivery`` and by ``flush``."""

    @abstractmethod
    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every queued record is acknowledged; raise ``DeliveryError`` if any failed."""

    def send(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int | None = None) -> Delivery:
        """Produce one record and wait for its acknowledgement; return where it was written."""
        deliveries: list[Delivery] = []
        self.produce(topic, value, key, partition=partition, on_delivery=deliveries.append)
        self.flush()
        return deliveries[0]

    @abstractmethod
    def close(self) -> None:
        """Flush and release resources."""

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Consumer(ABC):
    """Reads records; in a group it owns a share of the partitions and commits the offsets it has processed."""

    group: str | None

    @abstractmethod
    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Return up to ``max_records`` records, waiting at most ``timeout_s`` when none are ready."""

    @abstractmethod
    def commit(self) -> None:
        """Commit the position of every assigned partition (everything returned by ``poll`` so far)."""

    @abstractmethod
    def position(self) -> dict[TopicPartition, int]:
        """The next offset to be returned, per assigned partition."""

    @abstractmethod
    def committed(self, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """The group's committed offsets of the assigned partitions (absent: nothing committed). With
        ``timeout_s``: one try, and ``BusError`` when the answer takes longer (on Kafka, while an open transaction
        of a dead member holds an offset back); without: retried like any request."""

    @abstractmethod
    def assignment(self) -> list[TopicPartition]:
        """Partitions currently owned by this consumer."""

    @abstractmethod
    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Continue reading ``tp`` at ``offset`` (applied once the partition is assigned)."""

    @abstractmethod
    def seek_to_timestamp(self, timestamp_ms: int) -> dict[TopicPartition, int]:
        """Seek every assigned partition to its first record at or after ``timestamp_ms``; return the offsets."""

    @abstractmethod
    def close(self) -> None:
        """Leave the group (without committing) and release resources."""

    def rejoin(self) -> None:
        """After a ``MemberFencedError`` that says this consumer fenced itself: join again under the same instance
        id and read on from where ``poll`` left off. Only a bus whose members can fence themselves has this."""
        raise BusError(f"{type(self).__name__} cannot rejoin its group")

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TransactionalProducer(Producer):
    """Consume-transform-produce: the records of a transaction and the consumer's offsets commit atomically."""

    @abstractmethod
    def begin(self) -> None:
        """Start a transaction; records produced until ``commit``/``abort`` belong to it."""

    @abstractmethod
    def commit(self, consumer: Consumer | None = None) -> None:
        """Commit the transaction together with ``consumer``'s current positions."""

    @abstractmethod
    def abort(self) -> None:
        """Drop everything produced since ``begin``."""


class Bus(ABC):
    """Factory of producers and consumers, and topic administration, for one backend."""

    @abstractmethod
    def create_topic(
        self, name: str, partitions: int | None = None, config: dict[str, str] | None = None, *, exist_ok: bool = False
    ) -> None:
        """Create a topic; ``TopicExistsError`` if it exists, unless ``exist_ok``."""

    @abstractmethod
    def list_topics(self) -> list[str]:
        """Names of the user topics, sorted."""

    @abstractmethod
    def describe_topic(self, name: str) -> TopicInfo:
        """Partitions and offsets of one topic; ``TopicNotFoundError`` if absent. The end offsets are what a reader
        can read now: on Kafka the last stable offset, which stops at the first record of a transaction not yet
        decided."""

    def written_offsets(self, name: str) -> dict[int, int]:
        """Per partition, the offset after the last record written, counting records of transactions not yet
        committed or aborted (Kafka's high watermark). A read to these offsets ends once every transaction that
        had written by now is decided: what a new owner of a partition must wait for before it trusts the state
        it restores. Backends whose writes are visible at once return ``describe_topic``'s end offsets."""
        return dict(self.describe_topic(name).end_offsets)

    @abstractmethod
    def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The offsets ``group`` has committed, per partition, read without joining it (empty if it never has)."""

    @abstractmethod
    def producer(self) -> Producer:
        """An idempotent producer."""

    @abstractmethod
    def transactional_producer(self, transactional_id: str) -> TransactionalProducer:
        """A transactional producer; a previous one with the same id is fenced and its open work settled."""

    @abstractmethod
    def consumer(
        self,
        topics: Sequence[str],
        group: str | None = None,
        *,
        start: StartPosition = "earliest",
        instance_id: str | None = None,
    ) -> Consumer:
        """A consumer of ``topics``: in ``group`` (shares partitions, commits offsets) or, without one, of all
        partitions with no commits (replay, tail). ``start`` applies only to partitions the group has no committed
        offset for (``check_start``). ``instance_id`` gives a static membership, so a restarted process takes its
        predecessor's partitions at once instead of waiting for its session to lapse."""

    @abstractmethod
    def close(self) -> None:
        """Release resources held by the bus object itself."""

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def poll_through_self_fence(consumer: Consumer, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
    """``consumer.poll``, rejoining (and returning nothing this time) when the consumer fenced itself, as a static
    member does when its group's coordinator broker is lost; a fence by another consumer with the same instance id
    (or one the bus cannot attribute) is raised. For a consumer whose unprocessed records live only in memory (a
    trainer): a transactional consumer starts a fresh session from its committed offsets instead."""
    try:
        return consumer.poll(max_records, timeout_s)
    except MemberFencedError as exc:
        if exc.by_another is not False:
            raise
        consumer.rejoin()
        return []


def check_start(start: StartPosition) -> StartPosition:
    """``start`` if it is a valid start position, else ``BusError`` (a timestamp must be a non-negative int).

    >>> check_start("latest"), check_start(1_700_000_000_000)
    ('latest', 1700000000000)
    """
    if start in ("earliest", "latest"):
        return start
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise BusError(f"a consumer start is 'earliest', 'latest' or a timestamp in ms >= 0, not {start!r}")
    return start


def partition_for_key(key: bytes, partitions: int) -> int:
    """Stable partition of a key (murmur2, as Kafka's Java client and librdkafka's ``murmur2_random`` use)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as a signed 32-bit value."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h
