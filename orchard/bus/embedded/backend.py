"""``EmbeddedBus``: the bus interface over partition logs in a directory (the default backend): topics, their
metadata and retention, compaction, and making producers (``producers``) and consumers (``consumer``)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from orchard.bus.base import Bus, StartPosition, TopicInfo, TopicPartition, check_start
from orchard.bus.embedded.compaction import CompactionPolicy, cleanup_policies
from orchard.bus.embedded.consumer import EmbeddedConsumer
from orchard.bus.embedded.groups import GroupOffsets
from orchard.bus.embedded.locks import file_lock, write_atomic
from orchard.bus.embedded.log import PartitionLog
from orchard.bus.embedded.producers import EmbeddedProducer, EmbeddedTransactionalProducer
from orchard.bus.embedded.transactions import TransactionCoordinator
from orchard.bus.exceptions import BusError, BusUnavailableError, TopicExistsError, TopicNotFoundError
from orchard.config import EmbeddedBusConfig
from orchard.logging import get_logger

TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

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
