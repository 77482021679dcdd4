"""The consumer runtime: runs any ``Processor`` as its own consumer group, exactly once.

Every loop has the same shape: poll (at most ``max_poll_records``, waiting at most a second), decode each record,
``process`` it, ``punctuate``, then commit **one** transaction holding the outputs, the state-store changes
(``consumers.state``) and the input offsets. A crash anywhere leaves either all of a batch or none of it. A batch is
one poll or several: while records are waiting (a poll that does not wait returns some) the transaction stays open
for the next poll, until it is ``transaction_interval_s`` old or holds ``transaction_max_records`` records; an
empty poll, or a stop, commits it at once.

- A record that cannot be decoded, carries the wrong schema for its topic, or that the processor rejects
  (``RecordRejected``, or any other exception) goes to the dead-letter topic with the reason, inside the same
  transaction; its partial state changes and outputs are dropped; processing carries on.
- State is restored from the changelog before the first record of a (re)assigned partition is processed,
  and restored again whenever the group hands this instance a different set of partitions; ``Processor.open``
  is then called again with the restored store.
- Time: ``punctuate`` gets stream time (the newest input timestamp seen) while records flow, and the wall clock
  once a poll comes back empty with every assigned partition read to its end, so a consumer catching up on a
  backlog after downtime (or a slow fetch) does not time out episodes whose records are still unread.
- A transaction that cannot commit (the group moved a partition away, a newer instance fenced this one) drops
  the batch and starts a fresh session: new producer and consumer, state restored from the changelog.
- SIGTERM and SIGINT stop the loop after the current batch (``stop_on_signals``).

``DriverCore`` (decode, process, dead letters, outputs) is shared with ``consumers.replay``, which runs the same
processors offline over a range of recorded topics.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from consumers.config import RuntimeConfig
from consumers.processor import Input, Processor, RecordRejected
from consumers.state import ChangelogStateStore
from consumers.state_refs import InputRef
from orchard.bus import Bus, Consumer, Producer, Record, TopicPartition, TransactionalProducer, TransactionError
from orchard.bus.base import StartPosition
from orchard.bus.dead_letter import LETTER_OVERHEAD_BYTES
from orchard.bus.exceptions import BusError, MemberFencedError, TransactionPendingError
from orchard.bus.reading import reached
from orchard.clock import now_ms
from orchard.codec import Codec
from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import DEAD_LETTERS, TOPICS_BY_NAME

log = get_logger("consumers.runtime")
DEFAULT_LETTER_LIMIT = 1_000_000  # without a producer to ask: Kafka's default record limit
FENCED_AGAIN_S = 60.0  # a member fenced twice within this: another instance uses its id
READ_STALL_S = 30.0  # a topic read with no progress this long gives up (Kafka's first fetch can take seconds)
READ_GAP = 1000  # reading back referenced inputs: records between two wanted ones read through rather than seeking
UNDECIDED_LIMIT_S = 960.0  # Kafka's longest transaction (15 min) and its abort check: a wait on one past this gives up
COMMITTED_TIMEOUT_S = 1.0  # an idle check asking where the group left a partition: a held offset does not answer


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One output record waiting for its transaction (``topic`` is the physical topic)."""

    topic: str
    key: bytes | None
    value: bytes
    timestamp_ms: int
    partition: int | None = None


@dataclass
class RuntimeStats:
    """Counters of one runtime (or replay) run."""

    records_in: int = 0
    committed_in: int = 0  # input records whose transaction committed (the runtime's; replays commit none)
    outputs: int = 0
    dead_letters: int = 0
    transactions: int = 0
    restores: int = 0
    aborted_batches: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)


@dataclass
class _OpenTransaction:
    """The input records processed since the last commit, and when the first poll of them came back."""

    records: int = 0
    started: float = field(default_factory=time.monotonic)

    def add(self, records: int) -> None:
        if not self.records:
            self.started = time.monotonic()
        self.records += records

    def due(self, config: RuntimeConfig) -> bool:
        """Whether the transaction is old or large enough to commit (``transaction_interval_s``, ``..._records``)."""
        return self.records >= config.transaction_max_records or self._left_s(config) <= 0

    def poll_timeout_s(self, config: RuntimeConfig) -> float:
        """How long the next poll may wait: not at all while a transaction is open (only records already there
        join it; an empty poll commits it)."""
        return 0.0 if self.records else config.poll_timeout_s

    def _left_s(self, config: RuntimeConfig) -> float:
        return max(0.0, self.started + config.transaction_interval_s - time.monotonic())


def _rewound(before: Mapping[TopicPartition, int], after: Mapping[TopicPartition, int]) -> bool:
    """Whether a partition's position went back (or it was lost) between two reads: a rebalance within a poll."""
    return any(after.get(tp, -1) < offset for tp, offset in before.items())


class DriverCore:
    """Feeds records to a processor: decode, process with rollback, dead letters, and the outputs it emits."""

    def __init__(
        self,
        processor: Processor,
        state: ChangelogStateStore,
        *,
        group: str,
        codec: Codec | None = None,
        physical: Callable[[str], str] = lambda topic: topic,
        logical: Callable[[str], str] = lambda topic: topic,
        dead_letter_topic: str = DEAD_LETTERS,
        limits: Producer | None = None,
        stats: RuntimeStats | None = None,
    ) -> None:
        """``physical``/``logical`` map topic names both ways (a replay's namespace); ``limits`` is the producer
        that will write the outputs: an output it would refuse (``RecordTooLargeError``) fails its input now."""
        self.processor = processor
        self.state = state
        self.group = group
        self.codec = codec or Codec.default()
        self.physical, self.logical = physical, logical
        self.dead_letter_topic = dead_letter_topic
        self.limits = limits
        self.stats = stats or RuntimeStats()
        self.outbox: list[OutRecord] = []
        self.stream_time_ms = 0
        self._emit_time_ms = 0
        self._outputs = set(processor.output_topics)

    # ----------------------------------------------------------------- emitting
    def emit(self, topic: str, schema: str, record: Mapping[str, Any], key: str | bytes | None = None) -> None:
        """The ``Emit`` handed to the processor: encode now (a bad record fails the input that caused it)."""
        if topic not in self._outputs:
            raise ValueError(f"{self.group} emitted to {topic!r}, not one of its output topics {sorted(self._outputs)}")
        value = self.codec.encode(schema, record)
        raw_key = key.encode() if isinstance(key, str) else key
        target = self.physical(topic)
        if self.limits is not None:
            self.limits.check_size(target, raw_key, value)
        self.outbox.append(OutRecord(target, raw_key, value, self._emit_time_ms))

    # ----------------------------------------------------------------- records
    def handle(self, record: Record) -> None:
        """Process one input record; anything that fails sends it to the dead letters."""
        self.stats.records_in += 1
        self.stream_time_ms = max(self.stream_time_ms, record.timestamp_ms)
        self._emit_time_ms = record.timestamp_ms
        topic = self.logical(record.topic)
        try:
            decoded = self.codec.decode(record.value)
        except SerializationError as exc:
            self.dead_letter(record, str(exc), type(exc).__name__)
            return
        expected = TOPICS_BY_NAME[topic].schema if topic in TOPICS_BY_NAME else None
        if expected is not None and decoded.name != expected:
            reason = f"topic {topic!r} carries {expected} records, got a {decoded.name}"
            self.dead_letter(record, reason, "SchemaMismatchError")
            return
        message = Input(
            topic, decoded.name, decoded.record, record.key, record.timestamp_ms, record.partition, record.offset,
            record.value,
        )  # fmt: skip
        mark = len(self.outbox)
        self.state.begin_record(record.partition)
        try:
            self.processor.process(message, self.emit)
        except RecordRejected as exc:
            self._undo(mark)
            self.dead_letter(record, exc.reason, exc.error_type)
            return
        except Exception as exc:  # noqa: BLE001 - a processor bug on one record must not stop the stream
            self._undo(mark)
            log.exception("processor failed on a record", group=self.group, topic=record.topic, offset=record.offset)
            self.dead_letter(record, f"{type(exc).__name__}: {exc}", type(exc).__name__)
            return
        self.state.end_record()

    def punctuate(self, now: int) -> None:
        """Let the processor emit what timed out; a failure drops what it did and is logged."""
        mark = len(self.outbox)
        self._emit_time_ms = now
        self.state.begin_record(None)
        try:
            self.processor.punctuate(now, self.emit)
        except Exception:  # noqa: BLE001 - retried at the next punctuate
            self._undo(mark)
            log.exception("punctuate failed; its outputs and state changes were dropped", group=self.group)
            return
        self.state.end_record()

    def _undo(self, mark: int) -> None:
        del self.outbox[mark:]
        self.state.rollback_record()
        self.processor.open(self.state)  # its in-memory indexes may have moved ahead of the rolled-back state

    def dead_letter(self, record: Record, reason: str, error_type: str) -> None:
        """Queue a ``DeadLetter`` for ``record`` (cut to fit the record limit if need be)."""
        limit = DEFAULT_LETTER_LIMIT
        if self.limits is not None:
            limit = self.limits.record_limit(self.physical(self.dead_letter_topic))[0]
        room = limit - LETTER_OVERHEAD_BYTES - len(reason)
        original = record.value
        if len(original) > room:
            reason = f"{reason} [original cut from {len(original)} to {max(room, 0)} bytes to fit the letter]"
            original = original[: max(room, 0)]
        letter = {
            "original": original,
            "source_topic": self.logical(record.topic),
            "source_partition": record.partition,
            "source_offset": record.offset,
            "source_key": record.key,
            "reason": reason,
            "error_type": error_type,
            "consumer_group": self.group,
            "timestamp": self._emit_time_ms,
        }
        key = record.key if record.key is None or len(record.key) < 1024 else record.key[:1024]
        value = self.codec.encode("DeadLetter", letter)
        self.outbox.append(OutRecord(self.physical(self.dead_letter_topic), key, value, self._emit_time_ms))
        self.stats.dead_letters += 1
        log.warning(
            "dead-lettered record", group=self.group, topic=record.topic, partition=record.partition,
            offset=record.offset, error_type=error_type, reason=reason[:200],
        )  # fmt: skip

    def take_outbox(self) -> list[OutRecord]:
        """The outputs queued so far (and forget them)."""
        out, self.outbox = self.outbox, []
        self.stats.outputs += len(out)
        for item in out:
            self.stats.by_topic[item.topic] = self.stats.by_topic.get(item.topic, 0) + 1
        return out


def default_instance_id() -> str:
    """``$ORCHARD_INSTANCE_ID``, else the host name (a pod's name in Kubernetes: stable across restarts)."""
    return os.environ.get("ORCHARD_INSTANCE_ID") or socket.gethostname()


def changelog_topic(group: str) -> str:
    """The changelog topic of a consumer group's state."""
    return f"{group}.changelog"


def read_topic(
    bus: Bus,
    topic: str,
    *,
    start: Mapping[int, int] | None = None,
    end: Mapping[int, int] | None = None,
    poll_timeout_s: float = 0.5,
    stall_s: float = READ_STALL_S,
    undecided: bool = False,
    partitions: Iterable[int] | None = None,
) -> Iterator[Record]:
    """Every record of ``topic`` from ``start`` up to (not including) ``end`` offsets per partition (defaults:
    the whole topic as it is now), each partition in order.

    ``partitions``: only these (default: all). ``undecided``: read to the written offsets (``Bus.written_offsets``),
    past records of transactions still open, waiting until each is committed (its records come) or aborted
    (skipped): a state restore must not stop short of a transaction its partition's previous owner committed just
    before it let the partition go. A wait on an open transaction is not a stall; the broker decides every
    transaction within its timeout, and the read gives up after ``UNDECIDED_LIMIT_S``.

    The read ends when the consumer's position reaches ``end`` in every partition. On Kafka the end offsets a bus
    reports are the last stable offsets, and a read_committed consumer's position moves past transaction markers and
    aborted records, so it always gets there; a first fetch can take seconds on a busy broker or after a rebalance,
    and giving up on a few empty polls then would end a state restore short and drop live state. A read whose
    position does not move for ``stall_s`` seconds raises ``TopicReadError`` instead of returning less than asked
    for (position, not records: a long run of aborted records moves it without a record)."""
    info = bus.describe_topic(topic)
    limit = bus.written_offsets(topic) if undecided else info.end_offsets
    every = set(range(info.partitions))
    chosen = sorted(every if partitions is None else every & set(partitions))
    first = {p: max(info.start_offsets.get(p, 0), (start or {}).get(p, 0)) for p in chosen}
    last = {p: min(limit.get(p, 0), (end or limit).get(p, 0)) for p in chosen}
    if all(first[p] >= last[p] for p in first):
        return
    consumer = bus.consumer([topic])
    try:
        for p in range(info.partitions):
            # a partition with nothing to read starts at its end: fetching it from its start would read it all
            offset = first.get(p, 0)
            consumer.seek(TopicPartition(topic, p), offset if offset < last.get(p, 0) else info.end_offsets.get(p, 0))
        until = {TopicPartition(topic, p): last[p] for p in last if first[p] < last[p]}

        def watched() -> dict[TopicPartition, int]:
            # the partitions still to read only: writes to the others are no progress of this read
            at = consumer.position()
            return {tp: at[tp] for tp in until if tp in at}

        positions, readable = watched(), info.end_offsets
        moved, held_since = time.monotonic(), None
        while not reached(positions, until):
            for record in consumer.poll(max_records=2000, timeout_s=poll_timeout_s):
                if first.get(record.partition, 0) <= record.offset < last.get(record.partition, 0):
                    yield record
            now, before, positions = time.monotonic(), positions, watched()
            if positions != before:
                moved, held_since = now, None
            elif now - moved > stall_s:
                held = False
                if undecided:
                    ends, was = bus.describe_topic(topic).end_offsets, readable
                    readable = ends
                    if any(ends.get(tp.partition, 0) != was.get(tp.partition, 0) for tp in until):
                        moved, held_since = now, None  # a transaction was decided: its records are still to fetch
                        continue
                    held = _held(ends, positions, until)
                    if held:  # waiting on an open transaction is no stall, up to a bound
                        held_since = held_since or moved
                        if now - held_since < UNDECIDED_LIMIT_S:
                            moved = now
                            continue
                short = {tp.partition: (positions.get(tp), offset) for tp, offset in until.items()
                         if positions.get(tp, -1) < offset}  # fmt: skip
                why = f" (an open transaction held it past {UNDECIDED_LIMIT_S:g}s)" if held else ""
                raise TopicReadError(
                    f"reading {topic} made no progress for {stall_s:g}s short of its end (partition: (position, "
                    f"end) {short}){why}; stopped instead of returning part of it"
                )
    finally:
        consumer.close()


class TopicReadError(BusError):
    """A read of a topic's records up to given offsets stalled before it got there."""


def _held(
    ends: Mapping[int, int], positions: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> bool:
    """Whether every partition a read has not finished sits at its last stable offset (``ends``): an open
    transaction holds it (its records are still to be decided), as opposed to records that could be read not
    arriving."""
    short = [tp for tp, offset in until.items() if positions.get(tp, -1) < offset]
    return all(positions.get(tp, -1) >= ends.get(tp.partition, 0) for tp in short)


def read_offsets(
    bus: Bus,
    topic: str,
    offsets: Mapping[int, Iterable[int]],
    *,
    poll_timeout_s: float = 0.5,
    stall_s: float = READ_STALL_S,
) -> dict[tuple[int, int], bytes]:
    """The values of the records of ``topic`` at ``offsets`` (per partition), keyed by (partition, offset); records
    the topic no longer holds (below its log start or past its end) are absent. Offsets close together are read as
    one range (one pass per range of each partition), so reading back the open state of a stream costs about one
    read of its recent records.

    A record the topic still holds that did not come back is read once more, then raises ``StateRestoreError``:
    reporting it as gone would drop live state."""
    found = _read_offsets_once(bus, topic, offsets, poll_timeout_s=poll_timeout_s, stall_s=stall_s)
    missing = _held_but_missing(bus, topic, offsets, found)
    if missing:
        found.update(_read_offsets_once(bus, topic, missing, poll_timeout_s=poll_timeout_s, stall_s=stall_s))
        missing = _held_but_missing(bus, topic, missing, found)
    if missing:
        examples = sorted((p, o) for p, wanted in missing.items() for o in wanted)[:5]
        count = sum(map(len, missing.values()))
        raise StateRestoreError(
            f"could not read back {count} records {topic} still holds (partition, offset: {examples}); "
            "state restore stopped instead of dropping them"
        )
    return found


class StateRestoreError(RuntimeError):
    """Input records that state references, and that the input topic still holds, could not be read back."""


def _held_but_missing(
    bus: Bus, topic: str, offsets: Mapping[int, Iterable[int]], found: Mapping[tuple[int, int], bytes]
) -> dict[int, list[int]]:
    """Of ``offsets``, those the topic holds now (log start <= offset < end) that are not in ``found``."""
    info = bus.describe_topic(topic)
    missing: dict[int, list[int]] = {}
    for p, wanted in offsets.items():
        low, high = info.start_offsets.get(p, 0), info.end_offsets.get(p, 0)
        lacking = [o for o in wanted if low <= o < high and (p, o) not in found]
        if lacking:
            missing[p] = lacking
    return missing


def _read_offsets_once(
    bus: Bus, topic: str, offsets: Mapping[int, Iterable[int]], *, poll_timeout_s: float, stall_s: float
) -> dict[tuple[int, int], bytes]:
    """One pass of ``read_offsets``: what comes back, nothing retried."""
    runs = {p: _runs(sorted(set(wanted))) for p, wanted in offsets.items()}
    found: dict[tuple[int, int], bytes] = {}
    for i in range(max((len(r) for r in runs.values()), default=0)):
        start = {p: r[i][0] for p, r in runs.items() if i < len(r)}
        end = {p: r[i][-1] + 1 for p, r in runs.items() if i < len(r)}
        wanted = {p: set(r[i]) for p, r in runs.items() if i < len(r)}
        for record in read_topic(bus, topic, start=start, end=end, poll_timeout_s=poll_timeout_s, stall_s=stall_s):
            if record.offset in wanted[record.partition]:
                found[(record.partition, record.offset)] = record.value
    return found


def _runs(offsets: list[int]) -> list[list[int]]:
    """Sorted ``offsets`` split where the gap to the next exceeds ``READ_GAP`` records."""
    runs: list[list[int]] = []
    for offset in offsets:
        if runs and offset - runs[-1][-1] <= READ_GAP:
            runs[-1].append(offset)
        else:
            runs.append([offset])
    return runs


@contextlib.contextmanager
def stop_on_signals(runtime: ConsumerRuntime) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT ask ``runtime`` to stop after its current batch (main thread only)."""
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("stop requested", signal=signal.Signals(signum).name)
        runtime.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ConsumerRuntime:
    """Runs one processor instance in its consumer group on a bus, committing each batch in one transaction."""

    def __init__(
        self,
        bus: Bus,
        processor: Processor,
        *,
        config: RuntimeConfig | None = None,
        group: str | None = None,
        instance_id: str | None = None,
        codec: Codec | None = None,
        dead_letter_topic: str = DEAD_LETTERS,
        clock: Callable[[], int] = now_ms,
        namespace: str | None = None,
        start: StartPosition = "earliest",
    ) -> None:
        """``group`` defaults to the processor's name; ``instance_id`` (default ``default_instance_id()``) names
        the transactional producer and the static group membership, so a restarted instance fences its
        predecessor and takes its partitions back at once. With ``namespace`` every topic the processor reads or
        writes is ``<namespace>.<topic>`` (an isolated pipeline, or live processing of a replay's outputs), and
        the default group is ``<namespace>.<name>``. ``start`` is where the group begins on input partitions it
        has no committed offset for (``consumers.start``; committed offsets always win)."""
        self.bus = bus
        self.namespace = namespace
        self.prefix = f"{namespace}." if namespace else ""
        self.processor = processor
        self.config = config or RuntimeConfig()
        self.group = group or f"{self.prefix}{processor.name}"
        self.instance_id = instance_id or default_instance_id()
        self.codec = codec or Codec.default()
        self.dead_letter_topic = dead_letter_topic
        self.clock = clock
        self.start = start
        self.changelog = changelog_topic(self.group)
        self.stats = RuntimeStats()
        self._stop = False
        self._now = 0
        self._fenced_at = -math.inf
        self.log = log.bind(group=self.group, instance=self.instance_id)

    def stop(self) -> None:
        """Stop after the current batch (safe from a signal handler or another thread)."""
        self._stop = True

    def physical(self, topic: str) -> str:
        """The bus topic of a logical topic."""
        return f"{self.prefix}{topic}"

    def logical(self, topic: str) -> str:
        """The logical topic of a bus topic."""
        return topic.removeprefix(self.prefix) if self.prefix else topic

    # ----------------------------------------------------------------- setup
    def ensure_topics(self) -> int:
        """Create the standard inputs, the outputs, the dead letters and the changelog if absent; return the
        changelog's partition count (the inputs' largest)."""
        for topic in (*self.processor.input_topics, *self.processor.output_topics, self.dead_letter_topic):
            spec = TOPICS_BY_NAME.get(topic)
            if spec is not None or topic in self.processor.output_topics or topic == self.dead_letter_topic:
                self.bus.create_topic(self.physical(topic), spec.partitions if spec else None,
                                      spec.config if spec else None, exist_ok=True)  # fmt: skip
        counts = {t: self.bus.describe_topic(self.physical(t)).partitions for t in self.processor.input_topics}
        if len(set(counts.values())) > 1:  # one instance copes; several would split a key's records between them
            self.log.error("input topics differ in partition count: run one instance of this group", counts=counts)
        partitions = max(counts.values())
        self.bus.create_topic(self.changelog, partitions, {"cleanup.policy": "compact"}, exist_ok=True)
        return self.bus.describe_topic(self.changelog).partitions

    # ----------------------------------------------------------------- loop
    def run(self, *, idle_exit_s: float | None = None) -> RuntimeStats:
        """Process until ``stop()`` (or, with ``idle_exit_s``, until no record came for that long)."""
        partitions = self.ensure_topics()
        self.log.info("consumer starting", inputs=list(self.processor.input_topics),
                      outputs=list(self.processor.output_topics), start=self.start)  # fmt: skip
        idle_since = time.monotonic()
        while not self._stop:
            idle_since, idle = self._session(partitions, idle_exit_s, idle_since)
            if idle:
                break
        self.log.info("consumer stopped", **self._progress_fields())
        return self.stats

    def _session(self, partitions: int, idle_exit_s: float | None, idle_since: float) -> tuple[float, bool]:
        """One producer + consumer lifetime; returns when stopped, idle (True), or a transaction could not commit.

        Idle means no record for ``idle_exit_s`` and every assigned partition read to its end: a partition taken
        over from a member killed mid-transaction has no readable position until the broker aborts that
        transaction (``transaction_timeout_s`` on Kafka), and its records are still to come."""
        transactional_id = f"{self.group}.{self.instance_id}"
        producer = self.bus.transactional_producer(transactional_id)
        inputs = [self.physical(t) for t in self.processor.input_topics]
        consumer = self.bus.consumer(inputs, self.group, start=self.start, instance_id=transactional_id)
        state = ChangelogStateStore(partitions)
        driver = DriverCore(
            self.processor, state, group=self.group, codec=self.codec, dead_letter_topic=self.dead_letter_topic,
            physical=self.physical, logical=self.logical,
            limits=producer, stats=self.stats,
        )  # fmt: skip
        restored_for: set[TopicPartition] | None = None
        next_progress = time.monotonic() + self.config.progress_interval_s
        open_txn = _OpenTransaction()
        try:
            while not self._stop:
                waits = not open_txn.records  # an open transaction takes only the records already there
                before = {} if waits else consumer.position()
                try:
                    batch = consumer.poll(self.config.max_poll_records, open_txn.poll_timeout_s(self.config))
                except MemberFencedError as exc:
                    self._note_fenced(exc)
                    return idle_since, False
                assignment = set(consumer.assignment())
                if open_txn.records and (assignment != restored_for or _rewound(before, consumer.position())):
                    self._drop_open(open_txn)
                    return idle_since, False
                if assignment != restored_for:
                    if not self._await_committed(consumer, assignment):
                        return idle_since, False  # stopped while waiting
                    self._restore(state, assignment)
                    restored_for = assignment
                    idle_since = time.monotonic()  # a rebalance is not idleness: the new partitions are still to read
                for record in batch:
                    driver.handle(record)
                # an empty poll that did not wait (it ends an open transaction) says nothing of the ends: not asked
                caught_up = not batch and waits and self._caught_up(consumer)
                if batch:
                    self._now = max(self._now, driver.stream_time_ms)
                elif caught_up:
                    self._now = max(self._now, self.clock())
                driver.punctuate(self._now)
                open_txn.add(len(batch))
                if batch and not self._stop and not open_txn.due(self.config):
                    continue  # the next poll goes into the same transaction
                if not self._commit(producer, consumer, driver, state, open_txn.records):
                    return idle_since, False
                open_txn = _OpenTransaction()
                if batch:
                    idle_since = time.monotonic()
                elif (idle_exit_s is not None and time.monotonic() - idle_since >= idle_exit_s
                      and (caught_up or not assignment)):  # fmt: skip
                    return idle_since, True
                if time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + self.config.progress_interval_s
                    self.log.info("progress", state_keys=len(state._committed), **self._progress_fields())
            if open_txn.records and not self._commit(producer, consumer, driver, state, open_txn.records):
                return idle_since, False  # stopped between a poll and its commit: commit what it processed
        finally:
            consumer.close()
            producer.close()
        return idle_since, False

    def _drop_open(self, open_txn: _OpenTransaction) -> None:
        """Partitions moved while a transaction held processed records: drop them (never committed) and start a
        fresh session, which restores state and reads on from the committed offsets. Kafka may revoke and give
        back a partition within one poll, rewinding it to its committed offset: processing on would handle its
        records twice in one transaction."""
        self.stats.aborted_batches += 1
        self.log.warning("partitions were reassigned while a transaction was open; its records are processed "
                         "again from the committed offsets", records=open_txn.records)  # fmt: skip

    def _note_fenced(self, exc: MemberFencedError) -> None:
        """A member that fenced itself starts a fresh session (state restored, from the committed offsets):
        librdkafka fences a static member that rejoins after a session time-out (a coordinator broker lost), with
        no other process involved, and a broker lost twice fences it twice. Fenced by another instance with the
        same id: raise. When the bus cannot say which, a second fence within ``FENCED_AGAIN_S`` raises."""
        if exc.by_another:
            raise exc
        now = time.monotonic()
        if exc.by_another is None and now - self._fenced_at < FENCED_AGAIN_S:
            raise exc
        self._fenced_at = now
        self.log.warning("consumer fenced; starting a fresh session", by_another=exc.by_another,
                         again_within_s=FENCED_AGAIN_S)  # fmt: skip

    def _caught_up(self, consumer: Consumer) -> bool:
        """Whether every assigned partition has been read to its end, so idle time may count as time passing.

        An empty poll alone does not say so (a Kafka fetch can lag behind a backlog), and timing episodes out on
        the wall clock while their records are still unread would emit them as incomplete. A transactional
        input ends with a commit marker that is never returned to the consumer: one offset of slack."""
        assignment = consumer.assignment()
        if not assignment:
            return False
        positions = consumer.position()
        starts: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        try:
            for topic in {tp.topic for tp in assignment}:
                info = self.bus.describe_topic(topic)
                starts.update({TopicPartition(topic, p): start for p, start in info.start_offsets.items()})
                ends.update({TopicPartition(topic, p): end for p, end in info.end_offsets.items()})
        except OrchardError:
            return False
        # a position below the first offset retention kept means the partition is read from there
        fetched = {tp: max(pos, starts.get(tp, 0)) for tp, pos in positions.items()}
        unfetched = [tp for tp in assignment if tp not in fetched and ends.get(tp, 0) > starts.get(tp, 0)]
        if unfetched:
            # nothing fetched from them yet: where the group left them says (exactly: a commit marker at the end
            # would have been fetched and set a position). A committed offset that cannot be read in time is held
            # by an open transaction (a killed member's, until the broker aborts it): its records are still to come.
            try:
                committed = consumer.committed(timeout_s=COMMITTED_TIMEOUT_S)
            except OrchardError:
                return False
            if any(max(committed.get(tp, 0), starts.get(tp, 0)) < ends.get(tp, 0) for tp in unfetched):
                return False
        return all(fetched[tp] >= ends.get(tp, 0) - 1 for tp in assignment if tp in fetched)

    def _await_committed(self, consumer: Consumer, assignment: set[TopicPartition]) -> bool:
        """Wait until the group's offsets of ``assignment`` can be read (False: stopped first).

        A partition's previous owner may have sent its offsets into a transaction it has not decided yet: one it is
        about to commit (a member paused or slow when the group moved the partition), or one the broker will abort
        (a member killed mid-transaction). Until then the offset cannot be read, and the state changes of that
        transaction may not even have reached the changelog; restoring first would miss a committed change and then
        read on from past the input that made it."""
        if not assignment:
            return True
        started = warned = time.monotonic()
        while not self._stop:
            try:
                consumer.committed(timeout_s=COMMITTED_TIMEOUT_S)
                if time.monotonic() - started > COMMITTED_TIMEOUT_S:
                    self.log.info("taken-over offsets readable", waited_s=round(time.monotonic() - started, 1))
                return True
            except OrchardError as exc:
                if time.monotonic() - started > UNDECIDED_LIMIT_S:
                    raise BusError(
                        f"the group's offsets of {sorted(assignment)} stayed unreadable for "
                        f"{UNDECIDED_LIMIT_S:g}s, longer than any transaction may stay open: {exc}"
                    ) from exc
                time.sleep(0.2)  # an error that came back at once (a broker down) is not retried in a hot loop
                if time.monotonic() - warned >= 10.0 or warned == started:
                    warned = time.monotonic()
                    self.log.warning("waiting for the group's offsets of newly assigned partitions: a previous "
                                     "owner's transaction holds them until it is committed or aborted (or the "
                                     "broker does not answer)", waited_s=round(warned - started, 1),
                                     error=str(exc))  # fmt: skip
        return False

    def _restore(self, state: ChangelogStateStore, assignment: set[TopicPartition]) -> None:
        owned = {tp.partition for tp in assignment}
        started = time.perf_counter()
        # to the written offsets, not the readable ones: a transaction the previous owner committed just before it
        # let a partition go may not have its commit markers yet, and stopping short of it loses its changes
        records = read_topic(self.bus, self.changelog, poll_timeout_s=self.config.poll_timeout_s,
                             stall_s=self.config.restore_stall_s, undecided=True, partitions=owned)  # fmt: skip
        keys = state.restore(records, owned, resolve=self._read_inputs)
        if state.lost_keys:
            self.log.error("state keys lost: the input records they reference are gone from the input topics "
                           "(retention, or a recreated topic)", lost=len(state.lost_keys),
                           examples=state.lost_keys[:5])  # fmt: skip
        self.processor.open(state)
        self.stats.restores += 1
        self.log.info("state restored", partitions=sorted(owned), keys=keys,
                      seconds=round(time.perf_counter() - started, 3))  # fmt: skip

    def _read_inputs(self, refs: Iterable[InputRef]) -> dict[InputRef, bytes]:
        """The ``Resolver`` of this runtime's state: referenced input records read back from the bus."""
        wanted: dict[str, dict[int, list[int]]] = {}
        for ref in refs:
            wanted.setdefault(ref.topic, {}).setdefault(ref.partition, []).append(ref.offset)
        found: dict[InputRef, bytes] = {}
        for topic, offsets in wanted.items():
            values = read_offsets(self.bus, self.physical(topic), offsets, poll_timeout_s=self.config.poll_timeout_s,
                                  stall_s=self.config.restore_stall_s)  # fmt: skip
            found.update({InputRef(topic, p, o): value for (p, o), value in values.items()})
        return found

    def _commit(
        self,
        producer: TransactionalProducer,
        consumer: Consumer,
        driver: DriverCore,
        state: ChangelogStateStore,
        consumed: int,
    ) -> bool:
        """Write the batch's outputs, state changes and offsets (of ``consumed`` input records) in one transaction;
        False: start a new session."""
        outputs = driver.take_outbox()
        changes = state.changelog()
        if not (consumed or outputs or changes):
            return True
        try:
            producer.begin()
            for out in outputs:
                producer.produce(out.topic, out.value, out.key, partition=out.partition)
            for change in changes:
                producer.produce(self.changelog, change.value, change.key, partition=change.partition)
            producer.commit(consumer)
        except TransactionPendingError:
            state.commit()  # committed; the next producer with our id finishes applying it
            self.stats.committed_in += consumed
            self.log.warning("transaction committed but pending; restarting the session")
            return False
        except TransactionError as exc:
            state.rollback()
            self.stats.aborted_batches += 1
            self.log.warning("transaction aborted; restoring state and resuming from committed offsets",
                             error=str(exc))  # fmt: skip
            return False
        state.commit()
        self.stats.transactions += 1
        self.stats.committed_in += consumed
        return True

    def _progress_fields(self) -> dict[str, Any]:
        s = self.stats
        return {"records_in": s.records_in, "outputs": s.outputs, "dead_letters": s.dead_letters,
                "transactions": s.transactions, "restores": s.restores}  # fmt: skip
