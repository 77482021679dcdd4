"""``KafkaBus``: the bus interface on Apache Kafka through confluent-kafka (librdkafka).

Producers are idempotent with ``acks=all``; keys are partitioned with murmur2 like the embedded bus (and
Kafka's Java client), so a key lands on the same partition number on either backend. Group consumers read
``read_committed``, never auto-commit, and commit only what ``poll`` has returned. Transactions follow the
exactly-once loop of confluent-kafka's ``eos_transactions`` example: offsets are sent into the transaction,
and a new producer with the same transactional id fences and aborts its dead predecessor.

Brokers fail and come back: every metadata, watermark, offsets, admin and transaction request is retried while its
error is transient (a time-out, a leader or coordinator moving) with exponential backoff, up to
``retry_timeout_s`` in all (``kafka_faults.RetryPolicy``); only then is the error raised, naming what was asked and
for how long. Topics get replication 3 and ``min.insync.replicas`` 2 on three brokers or more
(``kafka_faults.choose_replication``).
A transactional producer that hit a fatal error is replaced by a fresh one with the same id before its next
transaction (one fenced by a newer producer is not: that one has taken over). A static group member fenced by
another with the same ``group.instance.id`` raises at its next ``poll`` instead of polling nothing forever; the
error says whether another consumer took the id or this one fenced itself, rejoining after its session timed out.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_STORED,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
)
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

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
)
from orchard.bus.exceptions import (
    BusError,
    BusUnavailableError,
    ConsumerClosedError,
    DeliveryError,
    MemberFencedError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionError,
)
from orchard.bus.kafka_faults import (
    FENCED_CODES,
    SETTLING_CODES,
    RetryPolicy,
    choose_replication,
    describe,
    error_of,
    kafka_errors,
    known_brokers,
    transient,
    transient_or_settling,
    txn_retriable,
)
from orchard.config import KafkaBusConfig
from orchard.logging import get_logger

log = get_logger("bus.kafka")
# librdkafka's own log lines (connection refused, retries) go to stdlib logging, not straight to stderr.
librdkafka_logger = logging.getLogger("orchard.bus.librdkafka")
REQUEST_OVERHEAD_BYTES = 64 * 1024
SELF_FENCE_WINDOW_S = 60.0  # a fence this soon after the member's own session time-out is taken as self-inflicted
T = TypeVar("T")


class KafkaBus(Bus):
    """The bus on a Kafka cluster; fails at construction when no broker answers within the connect timeout."""

    def __init__(self, config: KafkaBusConfig) -> None:
        self.config = config
        self.common: dict[str, Any] = {
            "bootstrap.servers": config.bootstrap_servers,
            "logger": librdkafka_logger,
            **config.client_options,
        }
        self.timeout_s = config.request_timeout_s
        self.retry = RetryPolicy(config.retry_timeout_s, config.retry_backoff_s, config.retry_backoff_max_s)
        self.admin = AdminClient(self.common)
        self._watermarks: RawConsumer | None = None
        self._created: dict[str, float] = {}  # topics this bus created -> when (monotonic)
        try:
            metadata = self.admin.list_topics(timeout=config.connect_timeout_s)
        except KafkaException as exc:
            raise BusUnavailableError(
                f"no Kafka broker answered at {config.bootstrap_servers} within {config.connect_timeout_s:g}s "
                f"({exc.args[0].str() if exc.args else exc})"
            ) from exc
        log.info("connected", bootstrap=config.bootstrap_servers, brokers=len(metadata.brokers))

    def request(
        self, doing: str, call: Callable[[], T], retry_if: Callable[[KafkaError | None], bool] = transient
    ) -> T:
        """``call()`` under the retry policy; a permanent error is raised as ``BusError`` naming ``doing``."""
        with kafka_errors(doing):
            return self.retry.call(doing, call, retry_if=retry_if)

    def _metadata(self, doing: str, topic: str | None = None) -> Any:
        return self.request(doing, lambda: self.admin.list_topics(topic=topic, timeout=self.timeout_s))

    # ---------------------------------------------------------------- topics
    def create_topic(
        self, name: str, partitions: int | None = None, config: dict[str, str] | None = None, *, exist_ok: bool = False
    ) -> None:
        """Create a topic and wait until every partition has a leader."""
        count = partitions or self.config.default_partitions
        brokers = known_brokers(self._metadata("read the cluster's brokers"))
        factor, min_isr = choose_replication(brokers, self.config.replication_factor, self.config.min_insync_replicas)
        settings = {"min.insync.replicas": str(min_isr), **(config or {})}
        attempts = 0

        def create() -> None:
            nonlocal attempts
            attempts += 1
            new = NewTopic(name, num_partitions=count, replication_factor=factor, config=settings)
            self.admin.create_topics([new], operation_timeout=self.timeout_s, request_timeout=self.timeout_s)[
                name
            ].result()

        try:
            self.retry.call(f"create topic {name!r}", create)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BusError(f"cannot create topic {name!r}: {error.str()}") from exc
            if attempts == 1 and not exist_ok:  # on a retry: most likely the attempt that timed out created it
                raise TopicExistsError(f"topic {name!r} already exists") from exc
            if attempts == 1:
                return
        self._wait_for_leaders(name, count)
        self._created[name] = time.monotonic()
        log.info("topic created", topic=name, partitions=count, replication=factor, min_insync_replicas=min_isr)

    def _wait_for_leaders(self, name: str, count: int) -> None:
        started = time.monotonic()
        deadline = started + max(self.timeout_s, self.config.retry_timeout_s)
        while time.monotonic() < deadline:
            topic = self._metadata(f"read the metadata of {name!r}", name).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == count:
                if all(p.leader >= 0 for p in topic.partitions.values()):
                    return
            time.sleep(0.05)
        raise BusError(
            f"topic {name!r} was created but its partitions got no leader within {time.monotonic() - started:.1f}s"
        )

    def list_topics(self) -> list[str]:
        """User topics (Kafka's internal ``__`` topics left out), sorted."""
        topics = self._metadata("list topics").topics
        return sorted(name for name in topics if not name.startswith("__"))

    def partitions(self, name: str) -> int:
        """Number of partitions of ``name``; ``TopicNotFoundError`` if absent.

        A topic this bus created a moment ago may still be unknown to the broker that answers (each broker learns
        of it from the controller in its own time): it is asked again until ``request_timeout_s`` after the creation.
        """
        settled = self._created.get(name, -math.inf) + self.timeout_s
        while True:
            topic = self._metadata(f"read the metadata of {name!r}", name).topics.get(name)
            if topic is not None and topic.error is None:
                return len(topic.partitions)
            if time.monotonic() >= settled:
                raise TopicNotFoundError(f"topic {name!r} does not exist (create it with `orchard topics create`)")
            time.sleep(0.1)

    def describe_topic(self, name: str) -> TopicInfo:
        """Partitions with their low and high watermarks."""
        count = self.partitions(name)
        starts, ends = {}, {}
        for p in range(count):
            starts[p], ends[p] = self.watermarks(RawTopicPartition(name, p))
        return TopicInfo(name=name, partitions=count, start_offsets=starts, end_offsets=ends)

    def _reader(self) -> RawConsumer:
        if self._watermarks is None:
            self._watermarks = RawConsumer({**self.common, "group.id": "orchard-watermarks"})
        return self._watermarks

    def watermarks(self, part: RawTopicPartition) -> tuple[int, int]:
        """Low and high watermark, retrying while the partition's leader is unreachable, moving or settling."""

        def query() -> tuple[int, int]:
            try:
                low, high = self._reader().get_watermark_offsets(part, timeout=self.timeout_s, cached=False)
            except KafkaException as exc:
                self._drop_stale_reader(exc)
                raise
            return int(low), int(high)

        return self.request(f"read offsets of {part.topic}[{part.partition}]", query, retry_if=transient_or_settling)

    def _drop_stale_reader(self, exc: KafkaException) -> None:
        """Close the reader after it called a known partition unknown: a broker restarting answered its metadata
        request before it had caught up, and the reader (subscribed to nothing) would keep that answer for good, so
        the next attempt asks with a fresh client."""
        error = error_of(exc)
        if error is not None and error.code() in SETTLING_CODES and self._watermarks is not None:
            log.info("watermark reader has stale metadata; reopening it", error=error.str())
            self._watermarks.close()
            self._watermarks = None

    def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The offsets ``group`` has committed (an OffsetFetch through the admin client: nobody joins the group)."""
        request = [ConsumerGroupTopicPartitions(group)]
        result = self.request(
            f"read the committed offsets of group {group!r}",
            lambda: self.admin.list_consumer_group_offsets(request, request_timeout=self.timeout_s)[group].result(
                timeout=self.timeout_s * 2
            ),
        )
        parts = result.topic_partitions or []
        return {TopicPartition(p.topic, p.partition): p.offset for p in parts if p.offset >= 0}

    def offsets_for_time(self, parts: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int]:
        """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``, else its end.

        The end (high watermark) is read before the lookup: a record produced meanwhile is then either found or at or
        after that end, so a consumer starting here never skips a record at or after ``timestamp_ms``.
        """
        ends = {tp: self.watermarks(RawTopicPartition(tp.topic, tp.partition))[1] for tp in parts}
        query = [RawTopicPartition(tp.topic, tp.partition, timestamp_ms) for tp in parts]
        if not query:
            return {}

        def lookup() -> list[RawTopicPartition]:
            try:
                found: list[RawTopicPartition] = self._reader().offsets_for_times(query, timeout=self.timeout_s)
            except KafkaException as exc:
                self._drop_stale_reader(exc)
                raise
            return found

        found = self.request("look up offsets by time", lookup)
        offsets = {TopicPartition(part.topic, part.partition): part.offset for part in found}
        return {tp: offsets[tp] if offsets.get(tp, -1) >= 0 else ends[tp] for tp in parts}

    # ---------------------------------------------------------------- clients
    def _producer_conf(self) -> dict[str, Any]:
        return {
            **self.common,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",
            "message.max.bytes": self.config.max_record_bytes + REQUEST_OVERHEAD_BYTES,
        }

    def producer(self) -> KafkaProducer:
        """An idempotent producer (acks=all)."""
        return KafkaProducer(self, RawProducer(self._producer_conf()))

    def transactional_producer(self, transactional_id: str) -> KafkaTransactionalProducer:
        """A transactional producer; ``init_transactions`` fences any predecessor with this id."""
        return KafkaTransactionalProducer(self, self.init_transactional(transactional_id), transactional_id)

    def init_transactional(self, transactional_id: str) -> RawProducer:
        """A raw producer with ``transactional_id``, its transactions initialised (retried while the transaction
        coordinator is unreachable or moving)."""
        raw = RawProducer({**self._producer_conf(), "transactional.id": transactional_id})
        try:
            self.retry.call(
                f"initialise transactions for {transactional_id!r}",
                lambda: raw.init_transactions(self.config.connect_timeout_s * 2),
            )
        except KafkaException as exc:
            raise TransactionError(f"cannot initialise transactions for {transactional_id!r}: {exc}") from exc
        return raw

    def consumer(
        self,
        topics: Sequence[str],
        group: str | None = None,
        *,
        start: StartPosition = "earliest",
        instance_id: str | None = None,
    ) -> KafkaConsumer:
        """A consumer; see ``Bus.consumer``."""
        for topic in topics:
            self.partitions(topic)
        return KafkaConsumer(self, list(topics), group, start=check_start(start), instance_id=instance_id)

    def close(self) -> None:
        """Close the watermark reader."""
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None


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

    def committed(self) -> dict[TopicPartition, int]:
        """Offsets committed by the group for the assigned partitions."""
        if self.group is None:
            return {}
        raw = self._consumer()
        parts = self.bus.request(
            f"read the committed offsets of group {self.group!r}",
            lambda: raw.committed(raw.assignment(), timeout=self.bus.timeout_s),
        )
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
