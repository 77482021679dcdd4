"""Compaction of a partition whose topic has ``cleanup.policy=compact``: the latest record of each key survives.

Kafka's semantics, with these departures:

- a tombstone is a record with an empty value (the bus's records have no null value; ``consumers/state.py``
  writes a state delete as an empty value). It removes its key's older records at once, and is itself dropped by
  the first compaction after its own timestamp is older than ``delete.retention.ms`` (default 24 h, as on Kafka),
  so a reader that follows the topic still sees the delete within that window;
- records without a key are kept (a Kafka broker refuses them on a compacted topic);
- the closed segments are rewritten into one compacted segment (Kafka groups them up to ``segment.bytes``);
- offsets are kept, so a compacted partition has gaps (as on Kafka); a reader at a missing offset gets the next
  record there is. ``TopicInfo.record_count`` (end minus start) counts the gaps too.

When: after an append rolls a segment, if the closed bytes never compacted are at least
``min.cleanable.dirty.ratio`` (default 0.5, as on Kafka) of all closed bytes, which bounds the rewriting to about
twice what is written; ``PartitionLog.compact()`` runs it regardless. The active segment is never touched.

How, safely with other processes reading and writing, and with the compactor killed at any point:

1. plan, under the partition lock: list the segments, delete superseded files, take the closed segments that end
   at or before the stable offset (the first offset of any transaction not yet fully applied, whose records a
   settling process counts by tag, so none may vanish; Kafka also cleans only below its last stable offset);
2. copy, holding only ``compact.lock`` (one compactor per partition; writers keep appending meanwhile): one pass
   over the sources finds each key's latest offset, a second writes the survivors to ``.<base>.cseg.<pid>.tmp``,
   completed (and fsynced with ``fsync: always``) before anything else changes;
3. swap, under the partition lock again: if retention deleted a source meanwhile, give up (nothing changed);
   otherwise rename the file to ``<base>.cseg`` (the commit point), then delete the sources.

Readers never see a torn state: every file is whole or absent; a reader whose listing is stale meets a missing
file and lists again; a crash between the rename and the deletes leaves superseded files that still hold valid
records (``segments`` says how they are read and cleaned up).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

from orchard import clock
from orchard.bus.embedded.frames import INDEX_ENTRY, StoredRecord, parse_frames
from orchard.bus.embedded.locks import file_lock, try_file_lock
from orchard.bus.embedded.segments import (
    COMPACTED,
    TABLE_ENTRY,
    CompactedWriter,
    Segment,
    list_segments,
    read_footer,
    segment_path,
    unlink_all,
    walk,
)

DEFAULT_DIRTY_RATIO = 0.5
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000
RECORDS_PER_READ = 4096
NO_LIMIT = 1 << 62


def cleanup_policies(topic_config: Mapping[str, str]) -> set[str]:
    """The topic's ``cleanup.policy`` as a set (``delete``, ``compact`` or both; ``delete`` if unset, as Kafka)."""
    return {p.strip() for p in topic_config.get("cleanup.policy", "delete").split(",")}


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """How a compacted topic is compacted (from its topic config)."""

    dirty_ratio: float = DEFAULT_DIRTY_RATIO
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str]) -> CompactionPolicy | None:
        """The policy of a topic whose ``cleanup.policy`` includes ``compact``; None for any other topic."""
        if "compact" not in cleanup_policies(config):
            return None
        return cls(
            dirty_ratio=float(config.get("min.cleanable.dirty.ratio", DEFAULT_DIRTY_RATIO)),
            delete_retention_ms=int(config.get("delete.retention.ms", DEFAULT_DELETE_RETENTION_MS)),
        )


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction did (``segments == 0``: nothing)."""

    segments: int = 0
    records_before: int = 0
    records_after: int = 0

    @property
    def removed(self) -> int:
        """Records dropped."""
        return self.records_before - self.records_after


NOTHING = CompactionResult()


class Compactor:
    """Compacts the closed segments of one partition directory."""

    def __init__(
        self,
        directory: Path,
        policy: CompactionPolicy,
        *,
        fsync: bool,
        stable_offset: Callable[[], int | None] | None = None,
    ) -> None:
        """``stable_offset``: the first offset of a transaction not yet fully applied, if any (see above)."""
        self.directory = str(directory)
        self.policy = policy
        self.fsync = fsync
        self.stable_offset = stable_offset
        self._lock_path = directory / "lock"
        self._compact_lock = directory / "compact.lock"

    def run(self, *, force: bool, now_ms: int | None = None) -> CompactionResult:
        """Compact if the dirty ratio is reached (always with ``force``).

        Without ``force`` it gives up at once if another process is compacting the partition (that one, or the
        next roll, covers what this one would have done); with it, it waits for that one to finish.
        """
        with try_file_lock(self._compact_lock, blocking=force) as held:
            if not held:
                return NOTHING
            with file_lock(self._lock_path):
                sources = self._plan(force)
            if not sources:
                return NOTHING
            try:
                temp, before, after = self._copy(sources, clock.now_ms() if now_ms is None else now_ms)
            except FileNotFoundError:  # retention deleted a source while we read it
                return NOTHING
            with file_lock(self._lock_path):
                if not self._swap(sources, temp):
                    return NOTHING
            return CompactionResult(len(sources), before, after)

    # ---------------------------------------------------------------- plan (partition lock held)
    def _plan(self, force: bool) -> list[Segment]:
        listing = list_segments(self.directory)
        segments, superseded = walk(self.directory, listing)
        unlink_all(superseded)
        # compact.lock is held, so a temporary file here belongs to a compactor that died
        unlink_all([f"{self.directory}/{name}" for name in listing.temps])
        closed = segments[:-1]  # the active segment is never compacted
        limit = self.stable_offset() if self.stable_offset is not None else None
        if limit is not None:
            closed = list(takewhile(lambda s: s.end <= limit, closed))
        dirty = sum(s.frame_bytes for s in closed if not s.compacted)
        total = sum(s.frame_bytes for s in closed)
        if not closed or (not force and (dirty == 0 or dirty < self.policy.dirty_ratio * total)):
            return []
        return closed

    # ---------------------------------------------------------------- copy (only compact.lock held)
    def _copy(self, sources: list[Segment], now_ms: int) -> tuple[str, int, int]:
        latest: dict[bytes, int] = {}
        before = 0
        for record, _ in self._records(sources):
            before += 1
            if record.key is not None:
                latest[record.key] = record.offset
        horizon = now_ms - self.policy.delete_retention_ms
        base, end = sources[0].base, sources[-1].end
        writer = CompactedWriter(f"{self.directory}/.{base:020d}{COMPACTED}.{os.getpid()}.tmp")
        try:
            for record, running_ts in self._records(sources):
                if record.key is not None and (
                    latest[record.key] != record.offset or (not record.value and record.timestamp_ms < horizon)
                ):
                    continue
                writer.add(record, running_ts)
            writer.finish(base, end, fsync=self.fsync)
        except BaseException:
            writer.discard()
            raise
        return writer.path, before, writer.count

    def _records(self, sources: list[Segment]) -> Iterator[tuple[StoredRecord, int]]:
        """Every record of ``sources`` in order, with its running max timestamp; CRCs always checked, since the
        frames are re-encoded and a damaged one must not come out with a fresh, valid checksum."""
        for segment in sources:
            if segment.compacted:
                fd = os.open(segment.files[0], os.O_RDONLY)
                try:
                    footer = read_footer(fd, segment.files[0])
                    table, count = footer.table(fd), footer.count
                finally:
                    os.close(fd)
                timestamps = (TABLE_ENTRY.unpack_from(table, i * TABLE_ENTRY.size)[2] for i in range(count))
            else:
                with open(segment.files[0], "rb") as index:
                    table = index.read((segment.end - segment.base) * INDEX_ENTRY.size)
                count = len(table) // INDEX_ENTRY.size
                timestamps = (INDEX_ENTRY.unpack_from(table, i * INDEX_ENTRY.size)[1] for i in range(count))
            frames = segment.files[0] if segment.compacted else segment.files[1]
            yield from zip(self._frames(frames, count), timestamps, strict=True)

    @staticmethod
    def _frames(path: str, count: int) -> Iterator[StoredRecord]:
        with open(path, "rb") as handle:  # frames start at position 0 in both kinds of segment
            done = 0
            while done < count:
                batch = parse_frames(
                    handle.read, min(RECORDS_PER_READ, count - done), NO_LIMIT, verify_crc=True, where=path
                )
                yield from batch
                done += len(batch)

    # ---------------------------------------------------------------- swap (partition lock held)
    def _swap(self, sources: list[Segment], temp: str) -> bool:
        try:
            unchanged = all(os.stat(s.files[0]).st_ino == s.inode for s in sources)
        except FileNotFoundError:
            unchanged = False
        if not unchanged:  # retention deleted a source meanwhile: leave everything as it is
            unlink_all([temp])
            return False
        target = segment_path(self.directory, sources[0].base, COMPACTED)
        os.replace(temp, target)  # the commit point
        if self.fsync:
            self._sync_directory()
        for segment in sources:
            if segment.files[0] != target:  # an older compacted segment at this base was just replaced
                unlink_all(segment.files)
        return True

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
