"""A processor's durable state: an in-memory key-value map, with every change written to a changelog topic
in the same transaction as the outputs and input offsets it goes with, and restored from that topic at start.

Layout of the changelog (``<group>.changelog``, one partition per input partition, compacted on Kafka):

- a change made while processing an input from partition *p* is written to changelog partition *p*, so an
  instance restores exactly the state of the input partitions it owns (co-keyed inputs with the same partition
  count are co-partitioned: partition *p* of ``model-calls`` and of ``outcomes`` holds the same episodes, of
  ``trajectories`` and ``scores`` the same tasks);
- a key lives in one partition at a time: when a record of another partition writes it, the old copy is
  deleted in the same transaction (a state key shared by episodes of several partitions therefore follows the
  last writer; with one instance, the default, every partition is owned and this never matters);
- a key first written by ``punctuate`` (no input record) lives in the partition its own hash picks, unless the
  processor names the partition (``at_partition``): a timer set for an input partition's state writes there;
- record key: the state key (UTF-8); value: ``b"P"`` + the value, or empty for a delete, or (``put_input``) a
  reference to the input record the value holds (``consumers.state_refs``): restore reads the record back from the
  input topic, so a processor that keeps whole inputs does not write their bytes twice. A referenced record the
  input topic no longer holds leaves its key out of the restored state (``lost_keys``, logged by the runtime) and
  its reference is deleted at the next commit.

Changes are staged per batch (committed or dropped with the transaction) and, inside a batch, per input record,
so a record whose processing fails leaves no partial state behind.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from consumers.processor import Input
from consumers.state_refs import REF, InputRef, Resolver, StoredRef, decode_ref, encode_ref
from orchard.bus.base import Record, partition_for_key

PUT = b"P"
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class ChangelogRecord:
    """One change to write to the changelog."""

    partition: int
    key: bytes
    value: bytes  # PUT + value, REF + where the value's input record is, or b"" for a delete


class ChangelogStateStore:
    """The ``StateStore`` of the consumer runtime (and, with no changelog, of replays)."""

    def __init__(self, partitions: int = 1) -> None:
        """``partitions``: how many partitions the changelog has (the input topics' largest count)."""
        self.partitions = max(1, partitions)
        self.current_partition: int | None = None  # input partition of the record being processed
        self._committed: dict[str, bytes] = {}
        self._home: dict[str, int] = {}  # changelog partition each committed key lives in
        self._batch: dict[str, bytes | None] = {}
        self._batch_home: dict[str, int] = {}
        self._batch_refs: dict[str, bytes] = {}  # changelog value of keys staged by ``put_input``
        self._undo: list[tuple[str, object, object, object]] | None = None
        self.lost_keys: list[str] = []  # keys the last restore could not read back (their input record is gone)

    # ------------------------------------------------------------------ StateStore
    def get(self, key: str) -> bytes | None:
        """The value under ``key`` as of this point of the batch."""
        if key in self._batch:
            return self._batch[key]
        return self._committed.get(key)

    def put(self, key: str, value: bytes) -> None:
        """Stage ``value`` under ``key``."""
        self._stage(key, bytes(value))

    def put_input(self, key: str, message: Input, prefix: bytes = b"") -> None:
        """Stage ``prefix + message.value`` under ``key``; the changelog records where the input is, not its bytes
        (restore reads it back from the input topic)."""
        ref = encode_ref(message.topic, message.partition, message.offset, message.value, prefix)
        self._stage(key, prefix + message.value, ref)

    def delete(self, key: str) -> None:
        """Stage the removal of ``key``."""
        if self.get(key) is not None:
            self._stage(key, None)

    def home(self, key: str) -> int | None:
        """The changelog partition ``key`` lives in as of this point of the batch (None: not stored)."""
        if key in self._batch:
            return self._batch_home[key] if self._batch[key] is not None else None
        return self._home.get(key)

    @contextmanager
    def at_partition(self, partition: int | None) -> Iterator[None]:
        """Changes made within go to changelog ``partition`` (None: where they would go anyway)."""
        saved = self.current_partition
        if partition is not None:
            self.current_partition = partition
        try:
            yield
        finally:
            self.current_partition = saved

    def items(self) -> Iterator[tuple[str, bytes]]:
        """Every key and value as of this point of the batch."""
        for key, value in self._committed.items():
            staged = self._batch.get(key, _ABSENT) if key in self._batch else value
            if staged is not None and staged is not _ABSENT:
                yield key, staged  # type: ignore[misc]
        for key, staged_value in self._batch.items():
            if key not in self._committed and staged_value is not None:
                yield key, staged_value

    def __len__(self) -> int:
        """Number of keys as of this point of the batch."""
        return sum(1 for _ in self.items())

    @property
    def committed_bytes(self) -> int:
        """Bytes of committed keys and values held in memory."""
        return sum(len(k) + len(v) for k, v in self._committed.items())

    # ------------------------------------------------------------------ staging
    def _stage(self, key: str, value: bytes | None, ref: bytes | None = None) -> None:
        if self._undo is not None:
            old = (self._batch.get(key, _ABSENT), self._batch_home.get(key, _ABSENT), self._batch_refs.get(key))
            self._undo.append((key, *old))
        self._batch[key] = value
        self._batch_home[key] = self._partition_for(key)
        if ref is None:
            self._batch_refs.pop(key, None)
        else:
            self._batch_refs[key] = ref

    def _partition_for(self, key: str) -> int:
        if self.current_partition is not None:
            return self.current_partition % self.partitions
        if key in self._batch_home:
            return self._batch_home[key]
        if key in self._home:
            return self._home[key]
        return partition_for_key(key.encode(), self.partitions)

    def begin_record(self, partition: int | None) -> None:
        """Start staging the changes of one input record (``None``: of ``punctuate``)."""
        self.current_partition = partition
        self._undo = []

    def end_record(self) -> None:
        """Keep the changes of the current record."""
        self.current_partition, self._undo = None, None

    def rollback_record(self) -> None:
        """Drop the changes of the current record (its processing failed)."""
        for key, value, home, ref in reversed(self._undo or []):
            if value is _ABSENT:
                self._batch.pop(key, None)
                self._batch_home.pop(key, None)
            else:
                self._batch[key] = value  # type: ignore[assignment]
                self._batch_home[key] = home  # type: ignore[assignment]
            if ref is None:
                self._batch_refs.pop(key, None)
            else:
                self._batch_refs[key] = ref  # type: ignore[assignment]
        self.current_partition, self._undo = None, None

    @property
    def dirty(self) -> bool:
        """Whether the batch changed anything."""
        return bool(self._batch)

    def changelog(self) -> list[ChangelogRecord]:
        """The changelog records of the batch's changes (one per key, plus a delete where a key moved)."""
        out: list[ChangelogRecord] = []
        for key, value in self._batch.items():
            raw, old, new = key.encode(), self._home.get(key), self._batch_home[key]
            if value is None:
                if old is not None:
                    out.append(ChangelogRecord(old, raw, b""))
                continue
            if old is not None and old != new:
                out.append(ChangelogRecord(old, raw, b""))
            ref = self._batch_refs.get(key)
            out.append(ChangelogRecord(new, raw, ref if ref is not None else PUT + value))
        return out

    def commit(self) -> None:
        """The batch's transaction committed: its changes become the committed state."""
        for key, value in self._batch.items():
            if value is None:
                self._committed.pop(key, None)
                self._home.pop(key, None)
            else:
                self._committed[key] = value
                self._home[key] = self._batch_home[key]
        self.rollback()

    def rollback(self) -> None:
        """The batch's transaction did not commit: forget its changes."""
        self._batch, self._batch_home, self._batch_refs, self._undo, self.current_partition = {}, {}, {}, None, None

    # ------------------------------------------------------------------ restore
    def restore(self, records: Iterable[Record], owned: set[int] | None = None, resolve: Resolver | None = None) -> int:
        """Rebuild the committed state from changelog ``records`` (each partition in order); only partitions in
        ``owned`` (None: all) count. ``resolve`` reads back the input records that references point at (needed
        only if the changelog holds references). Returns the number of keys restored; ``lost_keys`` lists those
        whose input record could not be read back."""
        per_partition: dict[int, dict[str, bytes]] = {}
        for record in records:
            if owned is not None and record.partition not in owned or record.key is None:
                continue
            per_partition.setdefault(record.partition, {})[record.key.decode()] = record.value
        live: list[tuple[str, bytes | StoredRef, int]] = []  # in partition order, as restored before references
        for partition in sorted(per_partition):
            for key, value in per_partition[partition].items():
                # a key has a live value in one partition at most (moves delete the old)
                if value.startswith(PUT):
                    live.append((key, value[len(PUT) :], partition))
                elif value.startswith(REF):
                    live.append((key, decode_ref(value), partition))
        found = _read_back([v.source for _, v, _ in live if isinstance(v, StoredRef)], resolve)
        self._committed, self._home, self.lost_keys = {}, {}, []
        self.rollback()
        for key, value, partition in live:
            restored = value if isinstance(value, bytes) else value.value(found.get(value.source))
            self._home[key] = partition
            if restored is None:
                # the next commit deletes a lost key's reference: it cannot come back to life at a later restore
                self.lost_keys.append(key)
                self._batch[key], self._batch_home[key] = None, partition
            else:
                self._committed[key] = restored
        return len(self._committed)


def _read_back(sources: list[InputRef], resolve: Resolver | None) -> Mapping[InputRef, bytes]:
    """The input records at ``sources`` that ``resolve`` could still read."""
    if not sources:
        return {}
    if resolve is None:
        raise ValueError(f"the changelog holds {len(sources)} references to input records and no reader was given")
    return resolve(set(sources))
