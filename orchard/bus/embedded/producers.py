"""Embedded producers: ``EmbeddedProducer`` buffers records per partition and appends each partition's batch
under its lock; ``EmbeddedTransactionalProducer`` commits a transaction's records with a consumer's offsets through
the bus's transaction journal."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from orchard.bus.base import (
    TOPIC_MAX_BYTES,
    Consumer,
    Delivery,
    DeliveryCallback,
    Producer,
    TopicPartition,
    TransactionalProducer,
    partition_for_key,
)
from orchard.bus.embedded.consumer import EmbeddedConsumer
from orchard.bus.embedded.log import PendingRecord
from orchard.bus.exceptions import BusError, DeliveryError, TransactionError
from orchard.clock import now_ms

if TYPE_CHECKING:
    from orchard.bus.embedded.backend import EmbeddedBus

AUTO_FLUSH_BYTES = 4 * 1024 * 1024


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
