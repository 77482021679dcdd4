"""Topic replay: re-run consumers over a range of the recorded topics into a separate namespace of output topics.

``replay(bus, ["assembler", "mypackage.rewards:MyReward"], "exp42", ReplayRange(...))`` runs each consumer in
turn, offline, and writes what it emits to ``exp42.<topic>`` (``exp42.trajectories``, ``exp42.scores``, and
``exp42.dead-letters`` for records it rejects). The original topics are only read, never written.

- An input topic that an earlier consumer of the list writes is read from the namespace (all of it): the
  reward consumer after the assembler scores the replayed trajectories. Any other input is read from the
  original topic, over the range.
- The range is per partition: ``from_offset``..``to_offset`` (exclusive), or the offsets of the first records
  at or after ``from_time_ms`` and ``to_time_ms`` (exclusive); both may be combined (the narrower wins).
- Deterministic: records are fed in (timestamp, topic, partition, offset) order, ``punctuate`` runs on stream
  time (each time it enters a new second, and once at the end), state starts empty, and each output record's
  bus timestamp is the stream time that produced it. Replaying the same range twice gives identical topics:
  same records, same keys, same partitions, same order, same timestamps.
- A namespace whose output topics already hold records is refused (the bus never deletes topics: pick a new
  namespace per experiment).
- At the end of the range, ``punctuate`` runs once more at ``drain_ms`` past the last record's time (default
  one day), so whatever waits for more input (open groups, score settling, episodes without an outcome in the
  range) is flushed as it would be once its timeout lapsed; ``drain_ms=0`` leaves it unflushed.
- A stage's input range is held in memory while it is sorted: replay a range that fits in memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from consumers.builtin import build_processor
from consumers.config import ConsumersConfig
from consumers.processor import Processor
from consumers.runtime import DriverCore, RuntimeStats, read_topic
from consumers.state import ChangelogStateStore
from orchard.bus import Bus, Producer, Record, TopicNotFoundError
from orchard.codec import Codec
from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from orchard.topics import DEAD_LETTERS, TOPICS_BY_NAME

log = get_logger("consumers.replay")
NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
PUNCTUATE_EVERY_MS = 1000
DEFAULT_DRAIN_MS = 86_400_000


class ReplayError(OrchardError):
    """A replay cannot start: bad namespace, namespace already used, or a missing input topic."""


@dataclass(frozen=True, slots=True)
class ReplayRange:
    """Which records of the original topics to replay (None: unbounded on that side)."""

    from_time_ms: int | None = None
    to_time_ms: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None


@dataclass
class StageReport:
    """What one consumer of a replay read and wrote."""

    consumer: str
    inputs: dict[str, str]  # logical input topic -> physical topic read
    stats: RuntimeStats = field(default_factory=RuntimeStats)


def namespaced(namespace: str, topic: str) -> str:
    """The replay output topic of ``topic``."""
    return f"{namespace}.{topic}"


def replay(
    bus: Bus,
    consumers: Sequence[str | Processor],
    namespace: str,
    span: ReplayRange | None = None,
    *,
    config: ConsumersConfig | None = None,
    codec: Codec | None = None,
    source: str | None = None,
    drain_ms: int = DEFAULT_DRAIN_MS,
) -> list[StageReport]:
    """Run ``consumers`` in order over ``span`` of the recorded topics into ``<namespace>.<topic>`` outputs.

    ``source``: read the recorded topics from ``<source>.<topic>`` (an earlier replay, an isolated pipeline)
    instead of the standard topics. ``drain_ms``: how far past the last record the final ``punctuate`` runs."""
    if drain_ms < 0:
        raise ReplayError(f"drain_ms must be >= 0, got {drain_ms}")
    if not NAMESPACE.match(namespace) or namespace in TOPICS_BY_NAME:
        raise ReplayError(f"invalid namespace {namespace!r}: use 1-100 of A-Z a-z 0-9 _ - (not a standard topic name)")
    if source is not None and source == namespace:
        raise ReplayError(f"the namespace {namespace!r} cannot also be the source")
    if not consumers:
        raise ReplayError("name at least one consumer to replay")
    processors = [c if isinstance(c, Processor) else build_processor(c, config) for c in consumers]
    _refuse_used_namespace(bus, namespace, processors)
    codec = codec or Codec.default()
    span = span or ReplayRange()
    produced: set[str] = set()
    reports = []
    producer = bus.producer()
    try:
        for processor in processors:
            reports.append(_stage(bus, producer, processor, namespace, span, produced, codec, source, drain_ms))
            produced.update(processor.output_topics)
    finally:
        producer.close()
    return reports


def _refuse_used_namespace(bus: Bus, namespace: str, processors: Sequence[Processor]) -> None:
    outputs = {t for p in processors for t in p.output_topics} | {DEAD_LETTERS}
    existing = set(bus.list_topics())
    used = [
        f"{name} ({info.record_count} records)"
        for name in sorted(namespaced(namespace, t) for t in outputs)
        if name in existing and (info := bus.describe_topic(name)).record_count > 0
    ]
    if used:
        raise ReplayError(
            f"namespace {namespace!r} is already used: {', '.join(used)}; replay into a new namespace "
            "(topics are never deleted or overwritten by a replay)"
        )


def _stage(
    bus: Bus,
    producer: Producer,
    processor: Processor,
    namespace: str,
    span: ReplayRange,
    produced: set[str],
    codec: Codec,
    source: str | None,
    drain_ms: int,
) -> StageReport:
    report = StageReport(processor.name, {})
    records: list[tuple[int, str, int, int, Record]] = []
    partitions = 1
    for topic in processor.input_topics:
        original = namespaced(source, topic) if source else topic
        physical = namespaced(namespace, topic) if topic in produced else original
        report.inputs[topic] = physical
        try:
            partitions = max(partitions, bus.describe_topic(physical).partitions)
        except TopicNotFoundError as exc:
            raise ReplayError(f"consumer {processor.name!r} reads {physical!r}, which does not exist") from exc
        start, end = (None, None) if topic in produced else range_offsets(bus, physical, span)
        for record in read_topic(bus, physical, start=start, end=end):
            records.append((record.timestamp_ms, topic, record.partition, record.offset, record))
    records.sort(key=lambda row: row[:4])
    _create_outputs(bus, processor, namespace)
    state = ChangelogStateStore(partitions)
    driver = DriverCore(
        processor, state, group=processor.name, codec=codec, limits=producer, stats=report.stats,
        physical=lambda t: namespaced(namespace, t), logical=lambda t: _logical(t, namespace, source),
    )  # fmt: skip
    processor.open(state)
    next_punctuate: int | None = None
    for _, _, _, _, record in records:
        if next_punctuate is not None and record.timestamp_ms >= next_punctuate:
            _punctuate(driver, producer, state, driver.stream_time_ms)
        driver.handle(record)
        next_punctuate = (driver.stream_time_ms // PUNCTUATE_EVERY_MS + 1) * PUNCTUATE_EVERY_MS
        _write(driver, producer, state)
    if records:
        _punctuate(driver, producer, state, driver.stream_time_ms + drain_ms)
    producer.flush()
    log.info("replayed", consumer=processor.name, namespace=namespace, records_in=report.stats.records_in,
             outputs=report.stats.outputs, dead_letters=report.stats.dead_letters)  # fmt: skip
    return report


def _logical(topic: str, namespace: str, source: str | None) -> str:
    for prefix in (namespace, source):
        if prefix and topic.startswith(f"{prefix}."):
            return topic[len(prefix) + 1 :]
    return topic


def _punctuate(driver: DriverCore, producer: Producer, state: ChangelogStateStore, now: int) -> None:
    driver.punctuate(now)
    _write(driver, producer, state)


def _write(driver: DriverCore, producer: Producer, state: ChangelogStateStore) -> None:
    for out in driver.take_outbox():
        # The end-of-range drain runs ahead of the data; brokers refuse timestamps far in the future
        # (Kafka: log.message.timestamp.after.max.ms), so no output is stamped later than the last input.
        timestamp_ms = min(out.timestamp_ms, driver.stream_time_ms)
        producer.produce(out.topic, out.value, out.key, partition=out.partition, timestamp_ms=timestamp_ms)
    state.commit()  # no changelog: a replay's state lives only as long as the replay


def _create_outputs(bus: Bus, processor: Processor, namespace: str) -> None:
    existing = set(bus.list_topics())
    for topic in (*processor.output_topics, DEAD_LETTERS):
        spec = TOPICS_BY_NAME.get(topic)
        partitions = bus.describe_topic(topic).partitions if topic in existing else (spec.partitions if spec else None)
        bus.create_topic(namespaced(namespace, topic), partitions, spec.config if spec else None, exist_ok=True)


def range_offsets(bus: Bus, topic: str, span: ReplayRange) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition, the first and the end (exclusive) offset of ``span`` in ``topic``."""
    info = bus.describe_topic(topic)
    start = {p: max(info.start_offsets.get(p, 0), span.from_offset or 0) for p in range(info.partitions)}
    end = dict(info.end_offsets)
    if span.to_offset is not None:
        end = {p: min(offset, span.to_offset) for p, offset in end.items()}
    for bound, side in ((span.from_time_ms, start), (span.to_time_ms, end)):
        if bound is None:
            continue
        consumer = bus.consumer([topic])
        try:
            consumer.assignment()
            found = consumer.seek_to_timestamp(bound)
        finally:
            consumer.close()
        for tp, offset in found.items():
            side[tp.partition] = max(side[tp.partition], offset) if side is start else min(side[tp.partition], offset)
    return start, end
