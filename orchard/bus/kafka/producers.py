"""Kafka producers: ``KafkaProducer`` (idempotent, ``acks=all``, sizes checked before sending, delivery errors raised
by ``flush``) and ``KafkaTransactionalProducer`` (transactions with the consumer's offsets sent into them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from orchard.bus.base import (
    TOPIC_MAX_BYTES,
    Consumer,
    Delivery,
    DeliveryCallback,
    Producer,
    TransactionalProducer,
)
from orchard.bus.exceptions import BusError, BusUnavailableError, DeliveryError, TransactionError
from orchard.bus.kafka.consumer import KafkaConsumer
from orchard.bus.kafka_faults import FENCED_CODES, describe, error_of, kafka_errors, txn_retriable
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.bus.kafka.backend import KafkaBus

log = get_logger("bus.kafka")


class KafkaProducer(Producer):
    """confluent-kafka producer with size checks before sending and delivery errors raised by ``flush``."""

    def __init__(self, bus: KafkaBus, raw: RawProducer) -> None:
        super().__init__(bus.config.max_record_bytes)
        self.bus = bus
        self.raw = raw
        self._failures: list[str] = []
        self._partitions: dict[str, int] = {}

    def _check_topic(self, topic: str, partition: int | None) -> None:
        if topic not in self._partitions:
            self._partitions[topic] = self.bus.partitions(topic)
        count = self._partitions[topic]
        if partition is not None and not 0 <= partition < count:
            raise BusError(f"topic {topic!r} has {count} partitions, no partition {partition}")

    def topic_max_bytes(self, topic: str) -> int | None:
        """The topic's effective ``max.message.bytes`` (its own, else the broker's)."""
        resource, timeout_s = ConfigResource(ResourceType.TOPIC, topic), self.bus.timeout_s
        try:
            entries = self.bus.request(
                f"read the config of {topic!r}",
                lambda: self.bus.admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(
                    timeout=timeout_s * 2
                ),
            )
        except BusError as exc:
            log.warning("cannot read topic limits; using bus.max_record_bytes", topic=topic, error=str(exc))
            return None
        entry = entries.get(TOPIC_MAX_BYTES)
        return int(entry.value) if entry is not None and entry.value is not None else None

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
        """Queue a record with librdkafka, waiting for queue space when it is full."""
        self._check_topic(topic, partition)
        self.check_size(topic, key, value)

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self._failures.append(f"{topic}: {err.str()}")
            if on_delivery is not None:
                offset = msg.offset() if err is None else -1
                on_delivery(Delivery(topic, msg.partition(), offset, None if err is None else err.str()))

        kwargs: dict[str, Any] = {"key": key, "on_delivery": delivered}
        if partition is not None:
            kwargs["partition"] = partition
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                self.raw.produce(topic, value, **kwargs)
                break
            except BufferError:  # local queue full: let librdkafka send, then retry
                self.raw.poll(0.05)
            except KafkaException as exc:
                self._produce_failed(topic, exc)
        self.raw.poll(0)

    def _produce_failed(self, topic: str, exc: KafkaException) -> None:
        raise DeliveryError(f"cannot produce to {topic!r}: {exc}") from exc

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for acknowledgements; raise ``DeliveryError`` for anything not acknowledged."""
        remaining = self.raw.flush(timeout_s)
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(f"{remaining} records still unacknowledged after {timeout_s:g}s")
        if failures:
            raise DeliveryError("records were not delivered: " + "; ".join(failures[:10]))

    def close(self) -> None:
        """Flush outstanding records."""
        self.flush()


class KafkaTransactionalProducer(TransactionalProducer, KafkaProducer):
    """Transactions on Kafka; a commit that cannot complete aborts and raises ``TransactionError``.

    Retriable errors of a transaction call are retried under the bus's retry policy. After a fatal error the
    librdkafka producer is unusable: this one raises ``TransactionError`` and takes a fresh producer with the same
    transactional id (fencing the broken one) at the next ``begin``, unless it was fenced by a newer producer."""

    def __init__(self, bus: KafkaBus, raw: RawProducer, transactional_id: str) -> None:
        KafkaProducer.__init__(self, bus, raw)
        self.transactional_id = transactional_id
        self._open = False
        self._broken: str | None = None  # why the raw producer is unusable

    def begin(self) -> None:
        """Begin a Kafka transaction (on a fresh producer if the last one hit a fatal error)."""
        if self._broken is not None:
            log.warning("replacing a transactional producer after a fatal error",
                        transactional_id=self.transactional_id, error=self._broken)  # fmt: skip
            self.raw = self.bus.init_transactional(self.transactional_id)
            self._broken = None
        try:
            self.raw.begin_transaction()
        except KafkaException as exc:
            self._note_fatal(exc)
            raise TransactionError(f"cannot begin a transaction: {describe(exc)}") from exc
        self._open = True

    def commit(self, consumer: Consumer | None = None) -> None:
        """Send the consumer's positions into the transaction and commit it."""
        timeout_s = self.bus.config.connect_timeout_s
        try:
            if consumer is not None:
                if not isinstance(consumer, KafkaConsumer) or consumer.raw is None:
                    raise TransactionError("the consumer must be an open Kafka consumer")
                positions = [RawTopicPartition(tp.topic, tp.partition, off) for tp, off in consumer.position().items()]
                metadata = consumer.raw.consumer_group_metadata()
                if positions:
                    self._call(
                        "send offsets into a transaction",
                        lambda: self.raw.send_offsets_to_transaction(positions, metadata, timeout_s),
                    )
            self._call("commit a transaction", lambda: self.raw.commit_transaction(timeout_s * 2))
        except (KafkaException, BusUnavailableError) as exc:
            self._abort_quietly()
            raise TransactionError(f"transaction aborted: {describe(exc)}") from exc
        finally:
            self._failures = []
        self._open = False

    def send(self, topic: str, value: bytes, key: bytes | None = None, *, partition: int | None = None) -> Delivery:
        """Not available: a transactional producer writes through ``begin``/``produce``/``commit``."""
        raise TransactionError("a transactional producer writes through begin(), produce() and commit()")

    def _call(self, doing: str, call: Callable[[], None]) -> None:
        try:
            self.bus.retry.call(doing, call, retry_if=txn_retriable)
        except KafkaException as exc:
            self._note_fatal(exc)
            raise

    def _note_fatal(self, exc: KafkaException) -> None:
        error = error_of(exc)
        if error is None or not error.fatal():
            return
        if error.code() in FENCED_CODES:
            log.warning("transactional producer fenced by a newer one with the same id",
                        transactional_id=self.transactional_id, error=error.str())  # fmt: skip
        else:
            self._broken = error.str()

    def _produce_failed(self, topic: str, exc: KafkaException) -> None:
        self._note_fatal(exc)
        raise TransactionError(f"cannot produce to {topic!r} in a transaction: {describe(exc)}") from exc

    def _abort_quietly(self) -> None:
        self._open = False
        if self._broken is not None:
            return  # nothing to abort on an unusable producer: its successor's init aborts what it left open
        try:
            self._call("abort a transaction", lambda: self.raw.abort_transaction(self.bus.config.connect_timeout_s))
        except (KafkaException, BusUnavailableError) as exc:
            log.warning("abort after failed commit also failed", error=describe(exc))

    def abort(self) -> None:
        """Abort the open transaction."""
        if not self._open:
            return
        self._open = False
        if self._broken is None:
            with kafka_errors("abort a transaction"):
                self._call("abort a transaction", lambda: self.raw.abort_transaction(self.bus.config.connect_timeout_s))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Records of a transaction are flushed by ``commit``; outside one this flushes as usual."""
        if not self._open:
            KafkaProducer.flush(self, timeout_s)

    def close(self) -> None:
        """Abort an open transaction."""
        self.abort()
