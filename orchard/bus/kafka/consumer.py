"""``KafkaConsumer``: a group member (subscribe; static with ``group.instance.id``, fenced members told apart) or,
without a group, a reader of every partition (assign)."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_STORED, KafkaError, KafkaException
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import TopicPartition as RawTopicPartition

from orchard.bus.base import Consumer, Record, StartPosition, TopicPartition
from orchard.bus.exceptions import BusError, ConsumerClosedError, MemberFencedError
from orchard.bus.kafka_faults import FENCED_CODES, kafka_errors
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.bus.kafka.backend import KafkaBus

log = get_logger("bus.kafka")
SELF_FENCE_WINDOW_S = 60.0  # a fence this soon after the member's own session time-out is taken as self-inflicted


class KafkaConsumer(Consumer):
    """A group member (subscribe) or, without a group, a reader of every partition (assign)."""

    def __init__(
        self, bus: KafkaBus, topics: list[str], group: str | None, *, start: StartPosition, instance_id: str | None
    ) -> None:
        self.bus = bus
        self.group = group
        self.instance_id = instance_id
        self._lost_at = -math.inf  # when a session time-out last took this member's partitions (monotonic)
        self.start = start
        self._pending_seeks: dict[TopicPartition, int] = {}
        conf: dict[str, Any] = {
            **bus.common,
            "group.id": group or f"orchard-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            # a timestamp start is resolved on assignment; if that offset is gone by the fetch, read from the start
            "auto.offset.reset": start if isinstance(start, str) else "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 10_000,
            # partition p of every input topic to one member: a processor's co-keyed inputs meet (the embedded
            # log's groups deal partitions the same way)
            "partition.assignment.strategy": "range",
            **bus.config.client_options,
        }
        if instance_id is not None:
            conf["group.instance.id"] = instance_id
        self._conf, self._topics = conf, list(topics)
        self._next: dict[TopicPartition, int] = {}  # the offset after the last record poll returned, or a seek's
        self.raw: RawConsumer | None = RawConsumer(conf)
        self._manual: dict[TopicPartition, int] = {}
        # Offsets this consumer was assigned or sought to, the position of a partition nothing was fetched from yet
        # (librdkafka knows a position only after a fetch): so a commit covers a start position that skipped records.
        self._assigned: dict[TopicPartition, int] = {}
        if group is None:
            # Concrete start offsets, not OFFSET_BEGINNING/END: librdkafka fetched ~6x slower from a logical
            # offset in our measurements (6.7k vs 40k records/s of 34 KB on one broker).
            parts = [TopicPartition(t, p) for t in topics for p in range(bus.partitions(t))]
            self._manual = self._start_offsets(parts)
            self._assign_manual()
        else:
            self.raw.subscribe(topics, on_assign=self._on_assign, on_lost=self._on_lost)

    def _consumer(self) -> RawConsumer:
        if self.raw is None:
            raise ConsumerClosedError("consumer is closed")
        return self.raw

    def _assign_manual(self) -> None:
        self._assigned = dict(self._manual)
        self._consumer().assign([RawTopicPartition(tp.topic, tp.partition, off) for tp, off in self._manual.items()])

    def _start_offsets(self, parts: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """Where ``parts`` start without a committed offset: their low or high watermark, or the offset of the start
        timestamp."""
        if isinstance(self.start, int):
            return self.bus.offsets_for_time(parts, self.start)
        side = 0 if self.start == "earliest" else 1
        return {tp: self.bus.watermarks(RawTopicPartition(tp.topic, tp.partition))[side] for tp in parts}

    def _on_assign(self, raw: RawConsumer, partitions: list[RawTopicPartition]) -> None:
        for part in partitions:
            target = self._pending_seeks.pop(TopicPartition(part.topic, part.partition), None)
            if target is not None:
                part.offset = target
        if self.start != "earliest":  # librdkafka resets to 'latest' lazily, at its first fetch: too late
            self._start_uncommitted(raw, [part for part in partitions if part.offset < 0])
        self._assigned = {TopicPartition(p.topic, p.partition): p.offset for p in partitions if p.offset >= 0}
        raw.assign(partitions)

    def _start_uncommitted(self, raw: RawConsumer, parts: list[RawTopicPartition]) -> None:
        """Point the partitions the group has no committed offset for at their start offsets now (in place), so
        'latest' means the end at assignment and a timestamp its first record at or after it, as on the embedded
        bus."""
        if not parts:
            return
        query = [RawTopicPartition(p.topic, p.partition) for p in parts]
        committed = self.bus.request(
            f"read the committed offsets of group {self.group!r} on assignment",
            lambda: raw.committed(query, timeout=self.bus.timeout_s),
        )
        offsets = self._start_offsets(sorted(TopicPartition(c.topic, c.partition) for c in committed if c.offset < 0))
        for part in parts:
            offset = offsets.get(TopicPartition(part.topic, part.partition))
            if offset is not None:
                part.offset = offset
        log.info("partitions without committed offsets start at their start position", group=self.group,
                 start=self.start, offsets={f"{tp.topic}[{tp.partition}]": o for tp, o in offsets.items()})  # fmt: skip

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Wait up to ``timeout_s`` for a first record, then take whatever else is already fetched."""
        raw = self._consumer()
        first = raw.poll(timeout_s)
        if first is None:
            return []
        messages = [first]
        if max_records > 1:
            messages.extend(raw.consume(num_messages=max_records - 1, timeout=0))
        out = []
        for msg in messages:
            error = msg.error()
            if error is not None:
                self._check_error(error)
                continue
            out.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], msg.key(), msg.value()))
            self._next[TopicPartition(msg.topic(), msg.partition())] = msg.offset() + 1
        return out

    def rejoin(self) -> None:
        """Replace a fenced group membership with a fresh one under the same ``group.instance.id`` that reads on
        from where ``poll`` left off on every partition it gets (not from the group's committed offsets)."""
        if self.group is None:
            raise BusError("only a group consumer can rejoin its group")
        resume = {**self._assigned, **self._next}
        old, self.raw = self._consumer(), None
        try:
            old.close()
        except (KafkaException, RuntimeError) as exc:  # a fatal consumer may refuse a clean leave
            log.warning("fenced consumer did not close cleanly", group=self.group, error=str(exc))
        self._pending_seeks.update(resume)
        self._assigned = {}
        self.raw = RawConsumer(self._conf)
        self.raw.subscribe(self._topics, on_assign=self._on_assign, on_lost=self._on_lost)
        log.info("rejoined the group after a fence", group=self.group, instance_id=self.instance_id,
                 resume={f"{tp.topic}[{tp.partition}]": o for tp, o in sorted(resume.items())})  # fmt: skip

    def _check_error(self, error: KafkaError) -> None:
        """Raise on a fatal error (a fenced static member: another process joined with the same instance id, so
        this one would otherwise poll nothing forever); log any other."""
        if not (error.fatal() or error.code() == KafkaError._FATAL):
            log.warning("consumer error", error=error.str())
            return
        if error.code() in FENCED_CODES or "fenced" in error.str().lower():
            by_another = self._fenced_by_another()
            if by_another is False:
                raise MemberFencedError(
                    f"consumer of group {self.group!r} was fenced by its own earlier membership of group.instance.id "
                    f"{self.instance_id!r} (it rejoined after its session timed out, as when the group's coordinator "
                    f"broker is lost); a fresh consumer with the same id may take over ({error.str()})",
                    by_another=False,
                )
            raise MemberFencedError(
                f"consumer of group {self.group!r} was fenced: another consumer joined the group with the same "
                f"group.instance.id {self.instance_id!r}, and only one may use it; give each process its own "
                f"instance id ({error.str()})",
                by_another=by_another,
            )
        raise BusError(f"fatal consumer error in group {self.group!r}: {error.str()}")

    def _fenced_by_another(self) -> bool:
        """Whether a fence now came from another consumer with this instance id: unless this consumer's session timed
        out shortly before (its assignment was lost), the only other way librdkafka gets fenced (issue #3437). The
        group's description cannot tell: right after a fence it still names the fenced member as the id's holder."""
        lost_ago = time.monotonic() - self._lost_at
        log.info("static member fenced", group=self.group, instance_id=self.instance_id,
                 session_lost_s_ago=round(lost_ago, 1) if math.isfinite(lost_ago) else None)  # fmt: skip
        return lost_ago > SELF_FENCE_WINDOW_S

    def _on_lost(self, raw: RawConsumer, partitions: list[RawTopicPartition]) -> None:
        """Note the time only: confluent-kafka unassigns the lost partitions itself when the callback does not."""
        self._lost_at = time.monotonic()
        log.warning("consumer session lost its partitions", group=self.group, partitions=len(partitions))

    def commit(self) -> None:
        """Commit the positions of what ``poll`` returned (synchronously; retried while the coordinator moves)."""
        if self.group is None:
            raise BusError("commit needs a consumer group")
        raw = self._consumer()
        try:
            self.bus.retry.call(f"commit the offsets of group {self.group!r}", lambda: raw.commit(asynchronous=False))
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise BusError(f"commit failed: {exc}") from exc

    def position(self) -> dict[TopicPartition, int]:
        """Next offsets, for partitions that have one: fetched from, or assigned or sought to a concrete offset."""
        raw = self._consumer()
        with kafka_errors("read positions"):
            parts = raw.position(raw.assignment())
        assigned = {TopicPartition(p.topic, p.partition): p.offset for p in parts}
        fetched = {tp: offset for tp, offset in assigned.items() if offset >= 0}
        return {**{tp: o for tp, o in self._assigned.items() if tp in assigned}, **fetched}

    def committed(self, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """Offsets committed by the group for the assigned partitions; with ``timeout_s`` one try (a read_committed
        member's offset fetch waits while a transaction holds an offset, so a dead member's hangs until the broker
        aborts it), raising ``BusError`` when it takes longer."""
        if self.group is None:
            return {}
        raw = self._consumer()
        doing = f"read the committed offsets of group {self.group!r}"
        if timeout_s is not None:
            with kafka_errors(doing):
                parts = raw.committed(raw.assignment(), timeout=timeout_s)
        else:
            parts = self.bus.request(doing, lambda: raw.committed(raw.assignment(), timeout=self.bus.timeout_s))
        return {TopicPartition(p.topic, p.partition): p.offset for p in parts if p.offset >= 0}

    def assignment(self) -> list[TopicPartition]:
        """Partitions currently assigned (after the group's first rebalance)."""
        return sorted(TopicPartition(p.topic, p.partition) for p in self._consumer().assignment())

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next."""
        if self.group is None:
            if tp not in self._manual:
                raise BusError(f"{tp.topic}[{tp.partition}] is not read by this consumer")
            self._manual.update(self.position())  # keep where the other partitions are
            self._manual[tp] = offset
            self._assign_manual()
            return
        raw = self._consumer()
        if tp not in self.assignment():
            self._pending_seeks[tp] = offset
            return
        self._assigned[tp] = offset
        self._next.pop(tp, None)
        try:
            raw.seek(RawTopicPartition(tp.topic, tp.partition, offset))
        except KafkaException:
            # The partition's fetcher has not started yet, so it takes no seek: assign it again with this start
            # offset (never poll here: a message polled and dropped would have its offset stored and committed).
            current = self.position()
            with kafka_errors(f"seek {tp.topic}[{tp.partition}]"):
                raw.assign(
                    [
                        RawTopicPartition(
                            p.topic,
                            p.partition,
                            self._start_for(TopicPartition(p.topic, p.partition), tp, offset, current),
                        )
                        for p in raw.assignment()
                    ]
                )

    @staticmethod
    def _start_for(
        part: TopicPartition, sought: TopicPartition, offset: int, current: dict[TopicPartition, int]
    ) -> int:
        if part == sought:
            return offset
        return current.get(part, OFFSET_STORED)

    def seek_to_timestamp(self, timestamp_ms: int) -> dict[TopicPartition, int]:
        """Seek each assigned partition to the first record at or after ``timestamp_ms`` (else to its end)."""
        result = self.bus.offsets_for_time(self.assignment(), timestamp_ms)
        for tp, offset in result.items():
            self.seek(tp, offset)
        return result

    def close(self) -> None:
        """Close the consumer (a static member keeps its slot until its session lapses)."""
        if self.raw is not None:
            self.raw.close()
            self.raw = None
