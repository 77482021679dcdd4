"""Atomic consume-transform-produce for the embedded bus.

A transaction commits by writing a journal (its records, the partitions' end offsets at that moment and the
consumer group's new offsets) while holding the locks of every partition it touches and of the group. The
journal's appearance is the commit point: the records and offsets are then applied, and the journal removed.
If the process dies in between, whoever opens the bus next (or the next producer with the same
transactional id) settles the journal: records carry the transaction's tag, so exactly the missing ones are
appended, and offsets only ever move forward.
"""

from __future__ import annotations

import json
import secrets
import struct
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from orchard.bus.base import TopicPartition
from orchard.bus.embedded.groups import GroupOffsets
from orchard.bus.embedded.locks import file_lock, write_atomic
from orchard.bus.embedded.log import PartitionLog, PendingRecord
from orchard.bus.exceptions import BusError, TransactionError, TransactionPendingError

MAGIC = b"OTX1"
LENGTH = struct.Struct("<I")


@dataclass
class Journal:
    """What a transaction commits: records per partition and the group's new offsets."""

    tag: int
    group: str | None
    offsets: dict[TopicPartition, int]
    records: dict[TopicPartition, list[PendingRecord]]
    starts: dict[TopicPartition, int]

    def encode(self) -> bytes:
        """Serialise as ``MAGIC | header length | JSON header | keys and values``."""
        return b"".join(self.pieces())

    def pieces(self) -> list[bytes]:
        """``encode``'s bytes as pieces to write in order, the records' keys and values not copied."""
        rows, payload = [], []
        for tp, records in sorted(self.records.items()):
            for record in records:
                key_len = -1 if record.key is None else len(record.key)
                rows.append([tp.topic, tp.partition, key_len, len(record.value), record.timestamp_ms])
                if record.key:
                    payload.append(record.key)
                payload.append(record.value)
        header = {
            "tag": self.tag,
            "group": self.group,
            "offsets": [[tp.topic, tp.partition, off] for tp, off in sorted(self.offsets.items())],
            "starts": [[tp.topic, tp.partition, off] for tp, off in sorted(self.starts.items())],
            "records": rows,
        }
        head = json.dumps(header).encode()
        return [MAGIC, LENGTH.pack(len(head)), head, *payload]

    @staticmethod
    def read_starts(path: Path) -> dict[TopicPartition, int]:
        """The ``starts`` of the journal at ``path``, reading its header only."""
        with open(path, "rb") as handle:
            head = handle.read(8)
            if head[:4] != MAGIC:
                raise ValueError("not a transaction journal")
            header = json.loads(handle.read(LENGTH.unpack_from(head, 4)[0]))
        return {TopicPartition(t, p): o for t, p, o in header["starts"]}

    @classmethod
    def decode(cls, data: bytes) -> Journal:
        """Inverse of ``encode``; ``ValueError`` for bytes that are not a whole journal (a header or payload cut
        short or followed by more: applying part of a transaction would write records cut short)."""
        if data[:4] != MAGIC or len(data) < 8:
            raise ValueError(f"not a transaction journal ({len(data)} bytes, no {MAGIC.decode()} header)")
        (head_len,) = LENGTH.unpack_from(data, 4)
        try:
            header = json.loads(data[8 : 8 + head_len])
        except ValueError as exc:
            raise ValueError(f"transaction journal header unreadable ({len(data)} bytes): {exc}") from exc
        position = 8 + head_len
        expected = position + sum(max(row[2], 0) + row[3] for row in header["records"])
        if len(data) != expected:
            raise ValueError(f"transaction journal of {len(data)} bytes where its header accounts for {expected}")
        tag = int(header["tag"])
        records: dict[TopicPartition, list[PendingRecord]] = {}
        for topic, partition, key_len, value_len, ts in header["records"]:
            key = None if key_len < 0 else data[position : position + key_len]
            position += max(key_len, 0)
            value = data[position : position + value_len]
            position += value_len
            records.setdefault(TopicPartition(topic, partition), []).append(PendingRecord(key, value, ts, tag))
        return cls(
            tag=tag,
            group=header["group"],
            offsets={TopicPartition(t, p): o for t, p, o in header["offsets"]},
            records=records,
            starts={TopicPartition(t, p): o for t, p, o in header["starts"]},
        )


def new_tag() -> int:
    """A random non-zero 63-bit transaction tag."""
    return secrets.randbits(63) | 1


class TransactionCoordinator:
    """Commits and settles transactions over the partition logs and group offsets of one embedded bus."""

    def __init__(
        self,
        directory: Path,
        log_for: Callable[[TopicPartition], PartitionLog],
        offsets_for: Callable[[str], GroupOffsets],
        *,
        fsync: bool,
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._log_for = log_for
        self._offsets_for = offsets_for
        self._fsync = fsync

    def journal_path(self, transactional_id: str, tag: int) -> Path:
        """Where one transaction's journal lives while it is being applied."""
        return self.directory / f"{transactional_id}.{tag:016x}.journal"

    def _id_lock(self, transactional_id: str) -> Path:
        return self.directory / f"{transactional_id}.lock"

    def _epoch_path(self, transactional_id: str) -> Path:
        return self.directory / f"{transactional_id}.epoch"

    def current_epoch(self, transactional_id: str) -> int:
        """The epoch of the newest producer with this id (0 if none was ever made)."""
        try:
            return int(self._epoch_path(transactional_id).read_text())
        except FileNotFoundError:
            return 0

    def register_producer(self, transactional_id: str) -> int:
        """Settle what a predecessor with this id left, then fence it: return the new producer's epoch."""
        for path in sorted(self.directory.glob(f"{transactional_id}.*.journal")):
            self.settle(path)
        with file_lock(self._id_lock(transactional_id)):
            epoch = self.current_epoch(transactional_id) + 1
            write_atomic(self._epoch_path(transactional_id), str(epoch).encode(), fsync=self._fsync)
        return epoch

    def commit(
        self,
        transactional_id: str,
        epoch: int,
        records: dict[TopicPartition, list[PendingRecord]],
        group: str | None,
        offsets: dict[TopicPartition, int],
        guard: Callable[[], None] | None = None,
    ) -> None:
        """Make ``records`` and ``offsets`` visible together.

        ``guard`` runs once every lock is held and may raise to abort (the consumer checks it still owns its
        partitions). ``TransactionError``: nothing is visible. ``TransactionPendingError``: the transaction is
        committed but not yet fully applied; whoever opens the bus next, or the next producer with this id,
        completes it.
        """
        tag = new_tag()
        tagged = {tp: [PendingRecord(r.key, r.value, r.timestamp_ms, tag) for r in rs] for tp, rs in records.items()}
        with self._locked(transactional_id, tagged, group):
            if self.current_epoch(transactional_id) != epoch:
                raise TransactionError(f"producer {transactional_id!r} was fenced by a newer one with the same id")
            if guard is not None:
                guard()
            starts = {tp: self._log_for(tp).end_offset() for tp in tagged}
            journal = Journal(tag, group, offsets, tagged, starts)
            path = self.journal_path(transactional_id, tag)
            try:
                write_atomic(path, journal.pieces(), fsync=self._fsync)  # written as is: no joined copy
            except OSError as exc:
                path.unlink(missing_ok=True)
                raise TransactionError(f"transaction {transactional_id!r} not committed: {exc}") from exc
            self._apply_or_leave_pending(journal, path)
        self._after_append(tagged)

    def _after_append(self, records: dict[TopicPartition, list[PendingRecord]]) -> None:
        """Let each written partition compact (only once every lock is released: compaction takes them itself)."""
        for tp in records:
            self._log_for(tp).after_append()

    def pending_start(self, tp: TopicPartition) -> int | None:
        """The first offset of ``tp`` that a transaction not yet fully applied has written or will write (its
        journal's start), or None: settling counts those records by tag, so compaction must keep below it."""
        starts = []
        for path in self.directory.glob("*.journal"):
            try:
                start = Journal.read_starts(path).get(tp)
            except FileNotFoundError:  # finished meanwhile
                continue
            except (ValueError, KeyError):  # unreadable: it might cover anything, so nothing is stable
                return 0
            if start is not None:
                starts.append(start)
        return min(starts, default=None)

    def _apply_or_leave_pending(self, journal: Journal, path: Path) -> None:
        try:
            self._apply(journal, settling=False)
        except OSError:
            try:  # once more, idempotently: a transient error (disk briefly full) should not leave it pending
                self._apply(journal, settling=True)
            except OSError as exc:
                raise TransactionPendingError(
                    f"transaction committed (journal {path.name}) but not yet applied: {exc}; it is completed by "
                    "the next open of the bus or the next producer with the same id"
                ) from exc
        path.unlink()

    def settle(self, path: Path) -> bool:
        """Finish the journal at ``path`` left by a dead process; return whether there was one to finish."""
        try:
            journal = Journal.decode(path.read_bytes())
        except FileNotFoundError:
            return False
        except ValueError as exc:
            raise BusError(
                f"cannot settle the transaction journal {path}: {exc}. It is damaged (a crash without fsync, or the "
                "disk); move it out of the directory to open the bus without that transaction"
            ) from exc
        transactional_id = path.name.rsplit(".", 2)[0]
        with self._locked(transactional_id, journal.records, journal.group):
            if not path.exists():  # its owner was alive and finished it while we waited for the locks
                return False
            self._apply(journal, settling=True)
            path.unlink()
        self._after_append(journal.records)
        return True

    def settle_all(self) -> int:
        """Settle every pending journal; return how many were settled."""
        return sum(self.settle(path) for path in sorted(self.directory.glob("*.journal")))

    def _locked(
        self, transactional_id: str, records: dict[TopicPartition, list[PendingRecord]], group: str | None
    ) -> ExitStack:
        stack = ExitStack()
        stack.enter_context(file_lock(self._id_lock(transactional_id)))
        for tp in sorted(records):  # one global order, so two transactions never deadlock
            stack.enter_context(file_lock(self._log_for(tp).directory / "lock"))
        if group is not None:
            stack.enter_context(file_lock(self._offsets_for(group).lock_path))
        return stack

    def _apply(self, journal: Journal, *, settling: bool) -> None:
        for tp, records in journal.records.items():
            log = self._log_for(tp)
            present = log.records_with_tag(journal.starts[tp], journal.tag) if settling else 0
            if present < len(records):
                log.append_locked(records[present:])
        if journal.group is not None and journal.offsets:
            self._offsets_for(journal.group).commit_locked(journal.offsets, only_forward=settling)
