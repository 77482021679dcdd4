"""``KafkaBus``: the bus interface on a Kafka cluster: connecting, creating and describing topics, reading watermarks
and committed offsets, and making producers and consumers (``producers``, ``consumer``)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException
from confluent_kafka import Producer as RawProducer
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from orchard.bus.base import Bus, StartPosition, TopicInfo, TopicPartition, check_start
from orchard.bus.exceptions import (
    BusError,
    BusUnavailableError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionError,
)
from orchard.bus.kafka.consumer import KafkaConsumer
from orchard.bus.kafka.producers import KafkaProducer, KafkaTransactionalProducer
from orchard.bus.kafka_faults import (
    SETTLING_CODES,
    RetryPolicy,
    choose_replication,
    error_of,
    kafka_errors,
    known_brokers,
    transient,
    transient_or_settling,
)
from orchard.config import KafkaBusConfig
from orchard.logging import get_logger

log = get_logger("bus.kafka")
# librdkafka's own log lines (connection refused, retries) go to stdlib logging, not straight to stderr.
librdkafka_logger = logging.getLogger("orchard.bus.librdkafka")
REQUEST_OVERHEAD_BYTES = 64 * 1024
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
        self._readers: dict[bool, RawConsumer] = {}  # watermark readers, by whether they see decided records only
        self._created: dict[str, float] = {}  # topics created (here or just before, elsewhere) -> when
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
            if attempts == 1:  # another client created it a moment ago: its metadata may not have reached us yet
                self._created.setdefault(name, time.monotonic())
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

    def written_offsets(self, name: str) -> dict[int, int]:
        """High watermarks: a read_uncommitted ``ListOffsets``, past the records of transactions still open."""
        parts = [RawTopicPartition(name, p) for p in range(self.partitions(name))]
        return {part.partition: self.watermarks(part, decided_only=False)[1] for part in parts}

    def _reader(self, decided_only: bool) -> RawConsumer:
        if decided_only not in self._readers:
            isolation = "read_committed" if decided_only else "read_uncommitted"
            self._readers[decided_only] = RawConsumer(
                {**self.common, "group.id": "orchard-watermarks", "isolation.level": isolation}
            )
        return self._readers[decided_only]

    def watermarks(self, part: RawTopicPartition, *, decided_only: bool = True) -> tuple[int, int]:
        """Low and high watermark, retrying while the partition's leader is unreachable, moving or settling. The
        high one is the last stable offset, or with ``decided_only=False`` the offset after the last record written
        (records of open transactions included)."""

        def query() -> tuple[int, int]:
            try:
                low, high = self._reader(decided_only).get_watermark_offsets(part, timeout=self.timeout_s, cached=False)
            except KafkaException as exc:
                self._drop_stale_reader(exc, decided_only)
                raise
            return int(low), int(high)

        return self.request(f"read offsets of {part.topic}[{part.partition}]", query, retry_if=transient_or_settling)

    def _drop_stale_reader(self, exc: KafkaException, decided_only: bool) -> None:
        """Close the reader after it called a known partition unknown: a broker restarting answered its metadata
        request before it had caught up, and the reader (subscribed to nothing) would keep that answer for good, so
        the next attempt asks with a fresh client."""
        error = error_of(exc)
        if error is not None and error.code() in SETTLING_CODES and decided_only in self._readers:
            log.info("watermark reader has stale metadata; reopening it", error=error.str())
            self._readers.pop(decided_only).close()

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
                found: list[RawTopicPartition] = self._reader(True).offsets_for_times(query, timeout=self.timeout_s)
            except KafkaException as exc:
                self._drop_stale_reader(exc, True)
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
        try:
            raw = RawProducer({
                # librdkafka's default is 60 s: a dead member's open transaction would hold its successor that long
                # (client_options, inside the producer settings, still win)
                "transaction.timeout.ms": round(self.config.transaction_timeout_s * 1000),
                **self._producer_conf(),
                "transactional.id": transactional_id,
            })  # fmt: skip
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
        """Close the watermark readers."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
