"""``EmbeddedBus``: the bus interface over partition logs in a directory (the default backend)."""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from orchard.bus.base import (
    TOPIC_MAX_BYTES,
    Bus,
    Consumer,
    Delivery,
    DeliveryCallback,
    Producer,
    Record,
    StartPosition,
    TopicInfo,
    TopicPartition,
    TransactionalProducer,
    check_start,
    partition_for_key,
)
from orchard.bus.embedded.compaction import CompactionPolicy, cleanup_policies
from orchard.bus.embedded.groups import GroupMembership, GroupOffsets
from orchard.bus.embedded.locks import file_lock, write_atomic
from orchard.bus.embedded.log import PartitionLog, PendingRecord
from orchard.bus.embedded.transactions import TransactionCoordinator
from orchard.bus.exceptions import (
    BusError,
    BusUnavailableError,
    ConsumerClosedError,
    DeliveryError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionError,
)
from orchard.clock import now_ms
from orchard.config import EmbeddedBusConfig
from orchard.logging import get_logger

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
AUTO_FLUSH_BYTES = 4 * 1024 * 1024
POLL_SLEEP_S = 0.01
REBALANCE_INTERVAL_S = 0.2

log = get_logger("bus.embedded")


class EmbeddedBus(Bus):
    """A durable single-machine log in ``config.path``; several processes may open the same directory."""

    def __init__(self, config: EmbeddedBusConfig) -> None:
        self.config = config
        self.root = Path(config.path)
        try:
            for sub in ("topics", "groups", "transactions"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            probe = self.root / ".writable"
            probe.touch()
        except OSError as exc:
            raise BusUnavailableError(f"embedded bus directory {self.root} is not usable: {exc}") from exc
        self._fsync = config.fsync == "always"
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._partitions: dict[str, int] = {}
        self._metas: dict[str, dict[str, object]] = {}
        self.transactions = TransactionCoordinator(
            self.root / "transactions", self.log_for, self.group_offsets, fsync=self._fsync
        )
        settled = self.transactions.settle_all()
        if settled:
            log.warning("settled interrupted transactions", count=settled)

    # ---------------------------------------------------------------- topics
    def _topic_dir(self, name: str) -> Path:
        return self.root / "topics" / name

    def create_topic(
        self, name: str, partitions: int | None = None, config: dict[str, str] | None = None, *, exist_ok: bool = False
    ) -> None:
        """Create a topic directory with its metadata file, atomically."""
        if not TOPIC_NAME.match(name):
            raise BusError(f"invalid topic name {name!r}: use 1-249 of A-Z a-z 0-9 . _ -")
        count = partitions or self.config.default_partitions
        if count < 1:
            raise BusError(f"topic {name!r} needs at least one partition, got {count}")
        meta_path = self._topic_dir(name) / "topic.json"
        with file_lock(self.root / "topics" / ".lock"):
            if meta_path.exists():
                if exist_ok:
                    return
                raise TopicExistsError(f"topic {name!r} already exists")
            meta_path.parent.mkdir(parents=True, exist_ok=True)
            body = json.dumps({"partitions": count, "config": config or {}}).encode()
            write_atomic(meta_path, body, fsync=self._fsync)
        log.info("topic created", topic=name, partitions=count)

    def _meta(self, name: str) -> dict[str, object]:
        """The topic's metadata, read once: a topic's partitions and config never change after creation."""
        if name not in self._metas:
            try:
                self._metas[name] = json.loads((self._topic_dir(name) / "topic.json").read_bytes())
            except FileNotFoundError as exc:
                raise TopicNotFoundError(
                    f"topic {name!r} does not exist (create it with `orchard topics create`)"
                ) from exc
        return self._metas[name]

    def topic_config(self, name: str) -> dict[str, str]:
        """The config the topic was created with."""
        return dict(self._meta(name).get("config") or {})  # type: ignore[call-overload]

    def partitions(self, name: str) -> int:
        """Number of partitions of ``name`` (cached: partition counts never change)."""
        if name not in self._partitions:
            self._partitions[name] = int(self._meta(name)["partitions"])  # type: ignore[call-overload]
        return self._partitions[name]

    def list_topics(self) -> list[str]:
        """Names of every topic, sorted."""
        base = self.root / "topics"
        return sorted(entry.name for entry in os.scandir(base) if (Path(entry.path) / "topic.json").exists())

    def describe_topic(self, name: str) -> TopicInfo:
        """Partitions, start and end offsets, and config of ``name``."""
        meta = self._meta(name)
        count = int(meta["partitions"])  # type: ignore[call-overload]
        logs = [self.log_for(TopicPartition(name, p)) for p in range(count)]
        return TopicInfo(
            name=name,
            partitions=count,
            start_offsets={p: lg.start_offset() for p, lg in enumerate(logs)},
            end_offsets={p: lg.end_offset() for p, lg in enumerate(logs)},
            config=dict(meta.get("config") or {}),  # type: ignore[call-overload]
        )

    def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The offsets ``group`` has committed (read without joining it; empty for a group that never committed)."""
        if not (self.root / "groups" / group).is_dir():
            return {}
        return self.group_offsets(group).read()

    def log_for(self, tp: TopicPartition) -> PartitionLog:
        """The partition log of ``tp`` (topic must exist)."""
        if tp not in self._logs:
            count = self.partitions(tp.topic)
            if not 0 <= tp.partition < count:
                raise BusError(f"topic {tp.topic!r} has {count} partitions, no partition {tp.partition}")
            self._logs[tp] = PartitionLog(
                self._topic_dir(tp.topic) / str(tp.partition),
                segment_bytes=self.config.segment_bytes,
                fsync=self._fsync,
                verify_crc=self.config.verify_crc,
                retention_ms=self._retention_ms(tp.topic),
                compaction=CompactionPolicy.from_topic_config(self.topic_config(tp.topic)),
                stable_offset=lambda: self.transactions.pending_start(tp),
            )
        return self._logs[tp]

    def _retention_ms(self, topic: str) -> int | None:
        config = self.topic_config(topic)
        if cleanup_policies(config) == {"compact"}:
            return None  # compact alone never deletes by age, as in Kafka
        own = config.get("retention.ms")
        if own is not None:
            return None if int(own) < 0 else int(own)  # -1 keeps everything, as in Kafka
        return self.config.retention_ms

    def group_offsets(self, group: str) -> GroupOffsets:
        """Committed offsets of ``group``."""
        return GroupOffsets(self.root / "groups" / group, fsync=self._fsync)

    def enforce_retention(self) -> int:
        """Apply retention (a topic's ``retention.ms``, else ``bus.retention_ms``; none on a topic whose
        ``cleanup.policy`` is ``compact`` alone) to every partition now; return the number of segments deleted.
        Writers also apply it whenever a segment rolls."""
        deleted = 0
        for name in self.list_topics():
            for p in range(self.partitions(name)):
                deleted += self.log_for(TopicPartition(name, p)).enforce_retention()
        return deleted

    def compact(self, topic: str | None = None, now_ms: int | None = None) -> int:
        """Compact every partition of ``topic`` (default: of every topic with ``cleanup.policy=compact``) now;
        return the number of records removed. Writers also compact whenever a segment rolls."""
        removed = 0
        for name in [topic] if topic is not None else self.list_topics():
            for p in range(self.partitions(name)):
                removed += self.log_for(TopicPartition(name, p)).compact(now_ms).removed
        return removed

    # ---------------------------------------------------------------- clients
    def producer(self) -> EmbeddedProducer:
        """A producer that appends in batches on ``flush`` (or every few MiB)."""
        return EmbeddedProducer(self)

    def transactional_producer(self, transactional_id: str) -> EmbeddedTransactionalProducer:
        """A transactional producer; first settles whatever a dead predecessor with this id left."""
        if not TOPIC_NAME.match(transactional_id):
            raise BusError(f"invalid transactional id {transactional_id!r}: use 1-249 of A-Z a-z 0-9 . _ -")
        epoch = self.transactions.register_producer(transactional_id)
        return EmbeddedTransactionalProducer(self, transactional_id, epoch)

    def consumer(
        self,
        topics: Sequence[str],
        group: str | None = None,
        *,
        start: StartPosition = "earliest",
        instance_id: str | None = None,
    ) -> EmbeddedConsumer:
        """A consumer of ``topics``; see ``Bus.consumer``."""
        for topic in topics:
            self.partitions(topic)  # fail now on a missing topic
        if group is not None:
            self.transactions.settle_all()  # committed offsets must include any interrupted transaction
        return EmbeddedConsumer(self, list(topics), group, start=check_start(start), instance_id=instance_id)

    def close(self) -> None:
        """Nothing to release: every handle is opened per operation."""


class EmbeddedProducer(Producer):
    """Buffers records per partition and appends each partition's batch under its lock."""

    def __init__(self, bus: EmbeddedBus) -> None:
        super().__init__(bus.config.max_record_bytes)
        self.bus = bus
        self._buffer: dict[TopicPartition, list[tuple[PendingRecord, DeliveryCallback | None]]] = {}
        self._buffered_bytes = 0
        self._round_robin = itertools.count()

    def topic_max_bytes(self, topic: str) -> int | None:
        """The topic's ``max.message.bytes`` if it was created with one."""
        value = self.bus.topic_config(topic).get(TOPIC_MAX_BYTES)
        return int(value) if value is not None else None

    def _route(self, topic: str, key: bytes | None, partition: int | None) -> TopicPartition:
        count = self.bus.partitions(topic)
        if partition is None:
            partition = partition_for_key(key, count) if key is not None else next(self._round_robin) % count
        elif not 0 <= partition < count:
            raise BusError(f"topic {topic!r} has {count} partitions, no partition {partition}")
        return TopicPartition(topic, partition)

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
        """Queue a record; it is appended by the next ``flush`` (or automatically past a few MiB)."""
        self._enqueue(topic, value, key, partition, timestamp_ms, on_delivery)
        if self._buffered_bytes >= AUTO_FLUSH_BYTES:
            self.flush()

    def _enqueue(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        partition: int | None,
        timestamp_ms: int | None,
        on_delivery: DeliveryCallback | None,
    ) -> None:
        tp = self._route(topic, key, partition)
        self.check_size(topic, key, value)
        record = PendingRecord(key, value, timestamp_ms if timestamp_ms is not None else now_ms())
        self._buffer.setdefault(tp, []).append((record, on_delivery))
        self._buffered_bytes += len(value)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Append every buffered record, then report deliveries; raise ``DeliveryError`` for failed appends.

        Every partition is written before any callback runs, so a raising callback cannot keep records from
        being written; its exception is re-raised once all callbacks ran.
        """
        pending = list(self._buffer.items())
        self._buffer, self._buffered_bytes = {}, 0
        reports: list[tuple[DeliveryCallback, Delivery]] = []
        failures: list[str] = []
        for i, (tp, items) in enumerate(pending):
            try:
                first = self.bus.log_for(tp).append([record for record, _ in items])
            except OSError as exc:
                failures.append(f"{tp.topic}[{tp.partition}]: {exc}")
                reports += [(cb, Delivery(tp.topic, tp.partition, -1, str(exc))) for _, cb in items if cb]
                continue
            except BaseException:
                self._requeue(pending[i:])  # nothing unwritten is dropped silently
                raise
            reports += [(cb, Delivery(tp.topic, tp.partition, first + j)) for j, (_, cb) in enumerate(items) if cb]
        self._report(reports)
        if failures:
            raise DeliveryError("records were not written: " + "; ".join(failures))

    def _requeue(
        self, pending: list[tuple[TopicPartition, list[tuple[PendingRecord, DeliveryCallback | None]]]]
    ) -> None:
        for tp, items in pending:
            self._buffer.setdefault(tp, []).extend(items)
            self._buffered_bytes += sum(len(record.value) for record, _ in items)

    @staticmethod
    def _report(reports: list[tuple[DeliveryCallback, Delivery]]) -> None:
        first_error: BaseException | None = None
        for callback, delivery in reports:
            try:
                callback(delivery)
            except Exception as exc:  # noqa: BLE001 - every callback runs; the first error is re-raised below
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()


class EmbeddedTransactionalProducer(TransactionalProducer, EmbeddedProducer):
    """Buffers a transaction's records and commits them with the consumer's offsets through a journal."""

    def __init__(self, bus: EmbeddedBus, transactional_id: str, epoch: int) -> None:
        EmbeddedProducer.__init__(self, bus)
        self.transactional_id = transactional_id
        self.epoch = epoch
        self._in_transaction = False

    def begin(self) -> None:
        """Start a transaction."""
        if self._in_transaction:
            raise TransactionError("a transaction is already open")
        self._in_transaction = True

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
        """Add a record to the open transaction."""
        if not self._in_transaction:
            raise TransactionError("produce on a transactional producer needs begin() first")
        self._enqueue(topic, value, key, partition, timestamp_ms, on_delivery)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Nothing to do: a transaction's records are written by ``commit``."""

    def send(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int | None = None) -> Delivery:
        """Not available: a transactional producer writes through ``begin``/``produce``/``commit``."""
        raise TransactionError("a transactional producer writes through begin(), produce() and commit()")

    def commit(self, consumer: Consumer | None = None) -> None:
        """Write the transaction's records and ``consumer``'s positions atomically.

        If the consumer lost a partition to another group member meanwhile, the transaction is aborted (nothing
        visible) and the consumer goes back to its committed offsets, as a fenced Kafka transaction would.
        """
        if not self._in_transaction:
            raise TransactionError("commit without begin()")
        group, offsets, guard = None, {}, None
        if consumer is not None:
            if not isinstance(consumer, EmbeddedConsumer) or consumer.bus.root != self.bus.root:
                raise TransactionError("the consumer must belong to the same embedded bus")
            group, offsets, guard = consumer.group, consumer.position(), consumer.ensure_owner
        buffer, self._buffer, self._buffered_bytes = self._buffer, {}, 0
        records = {tp: [record for record, _ in items] for tp, items in buffer.items()}
        try:
            self.bus.transactions.commit(self.transactional_id, self.epoch, records, group, offsets, guard)
        except TransactionError:
            if consumer is not None:
                consumer.rewind_to_committed()
            raise
        finally:
            self._in_transaction = False
        # offsets inside a committed transaction are not tracked individually
        self._report(
            [(cb, Delivery(tp.topic, tp.partition, -1)) for tp, items in buffer.items() for _, cb in items if cb]
        )

    def abort(self) -> None:
        """Drop the open transaction's records."""
        self._buffer = {}
        self._in_transaction = False

    def close(self) -> None:
        """Abort an open transaction."""
        self.abort()


class EmbeddedConsumer(Consumer):
    """Reads partition logs; in a group it shares partitions with the group's other live members."""

    def __init__(
        self,
        bus: EmbeddedBus,
        topics: list[str],
        group: str | None,
        *,
        start: StartPosition,
        instance_id: str | None,
    ) -> None:
        self.bus = bus
        self.topics = topics
        self.group = group
        self.start = start
        self._positions: dict[TopicPartition, int] = {}
        self._pending_seeks: dict[TopicPartition, int] = {}
        self._next_rebalance = 0.0
        self._cursor = 0
        self._closed = False
        self._membership: GroupMembership | None = None
        self._offsets: GroupOffsets | None = None
        if group is not None:
            member = instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._offsets = bus.group_offsets(group)
            self._membership = GroupMembership(bus.root / "groups" / group, member, bus.config.session_timeout_ms)
        self._rebalance(force=True)

    def _all_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in self.topics for p in range(self.bus.partitions(t))]

    def _rebalance(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_rebalance:
            return
        self._next_rebalance = now + REBALANCE_INTERVAL_S
        partitions = self._all_partitions()
        if self._membership is not None:
            self._membership.heartbeat()
            partitions = self._membership.assignment(partitions)
        wanted = set(partitions)
        for tp in list(self._positions):
            if tp not in wanted:
                del self._positions[tp]
        new = [tp for tp in partitions if tp not in self._positions]
        committed = self._offsets.read() if (new and self._offsets is not None) else {}
        for tp in new:
            self._positions[tp] = self._initial_position(tp, committed)

    def _initial_position(self, tp: TopicPartition, committed: dict[TopicPartition, int]) -> int:
        if tp in self._pending_seeks:
            return self._pending_seeks.pop(tp)
        if tp in committed:
            return committed[tp]
        partition_log = self.bus.log_for(tp)
        if self.start == "earliest":
            return partition_log.start_offset()
        if self.start == "latest":
            return partition_log.end_offset()
        return partition_log.offset_for_timestamp(self.start)

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("consumer is closed")

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Read up to ``max_records`` from the assigned partitions, taking them in turn."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            self._rebalance()
            out = self._read_round(max_records)
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(POLL_SLEEP_S)

    def _read_round(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        tps = list(self._positions)
        for i in range(len(tps)):
            if len(out) >= max_records:
                break
            tp = tps[(self._cursor + i) % len(tps)]
            partition_log = self.bus.log_for(tp)
            position = self._positions[tp]
            start = partition_log.start_offset()
            if position < start:  # retention deleted what we had not read yet
                log.warning("offset out of range, skipping to log start", topic=tp.topic, partition=tp.partition)
                position = start
            batch = partition_log.read(position, max_records - len(out))
            if batch:
                out.extend(Record(tp.topic, tp.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in batch)
                self._positions[tp] = batch[-1].offset + 1
        self._cursor += 1
        return out

    def commit(self) -> None:
        """Commit the positions of the partitions this member still owns (a lost one is its new owner's)."""
        self._check_open()
        if self._offsets is None:
            raise BusError("commit needs a consumer group")
        self._rebalance(force=True)
        self._offsets.commit(dict(self._positions))

    def ensure_owner(self) -> None:
        """Raise ``TransactionError`` if another member has taken any of this consumer's partitions."""
        if self._membership is None:
            return
        self._membership.heartbeat(force=True)
        owned = set(self._membership.assignment(self._all_partitions()))
        lost = sorted(set(self._positions) - owned)
        if lost:
            raise TransactionError(f"partitions {lost} were reassigned to another member; transaction aborted")

    def rewind_to_committed(self) -> None:
        """Forget uncommitted progress: every partition goes back to its committed (or initial) offset."""
        self._positions = {}
        self._rebalance(force=True)

    def position(self) -> dict[TopicPartition, int]:
        """Next offsets to read."""
        return dict(self._positions)

    def committed(self) -> dict[TopicPartition, int]:
        """Committed offsets of the assigned partitions."""
        if self._offsets is None:
            return {}
        stored = self._offsets.read()
        return {tp: stored[tp] for tp in self._positions if tp in stored}

    def assignment(self) -> list[TopicPartition]:
        """Assigned partitions, sorted."""
        self._rebalance()
        return sorted(self._positions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next."""
        if tp in self._positions:
            self._positions[tp] = offset
        else:
            self._pending_seeks[tp] = offset

    def seek_to_timestamp(self, timestamp_ms: int) -> dict[TopicPartition, int]:
        """Seek each assigned partition to its first record at or after ``timestamp_ms``."""
        for tp in self._positions:
            self._positions[tp] = self.bus.log_for(tp).offset_for_timestamp(timestamp_ms)
        return dict(self._positions)

    def close(self) -> None:
        """Leave the group."""
        if not self._closed and self._membership is not None:
            self._membership.leave()
        self._closed = True
