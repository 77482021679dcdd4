"""One partition's log: segment files of framed records plus a dense index, appended under a file lock.

Layout of a partition directory: ``<base>.log`` holds frames (``frames``), ``<base>.idx`` holds one 16-byte entry
per record (position in the log, highest timestamp so far), ``lock`` serialises writers across processes. On a
compacted topic, closed segments are replaced by ``<base>.cseg`` files (``segments``, ``compaction``).

Why it survives ``kill -9`` of a writer: a record becomes visible (and is acknowledged) only after its index
entry is written, and index entries are written after the frames they point at. A writer that dies mid-append
leaves, at worst, a torn tail past the last indexed record; the next writer truncates it before appending.
Readers only ever read indexed records, so they never see a torn frame.

Why appends and ``end_offset`` do not list the directory: each instance caches the segment bases it last listed.
Only the newest segment ever grows, and a segment is closed by creating the next one's index at exactly
``base + records``; so "does ``<base + records>.idx`` exist?" (one ``stat``) tells whether another process rolled,
and a missing index of a cached segment tells that retention or compaction removed it. Either sends the instance
back to ``os.listdir``. Under the lock the answer is exact; without it (``end_offset``) it is exact for the
moment of the ``stat``. The state of the tail an append leaves is cached too, so the next append by the same
instance skips reading it back when the files' sizes show nobody else wrote since.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path

from orchard import clock
from orchard.bus.embedded import wakeup
from orchard.bus.embedded.compaction import NOTHING, CompactionPolicy, CompactionResult, Compactor
from orchard.bus.embedded.frames import (
    FRAME_HEAD,
    HEAD_SIZE,
    INDEX_ENTRY,
    READ_CHUNK,
    PendingRecord,
    StoredRecord,
    encode_frame,
    parse_frames,
    write_pieces,
)
from orchard.bus.embedded.locks import file_lock
from orchard.bus.embedded.segments import (
    COMPACTED,
    INDEX,
    LOG,
    TABLE_ENTRY,
    list_segments,
    read_footer,
    segment_path,
    unlink_all,
    walk,
)
from orchard.bus.exceptions import BusError
from orchard.logging import get_logger

__all__ = ["INDEX_ENTRY", "PartitionLog", "PendingRecord", "StoredRecord", "encode_frame"]

log = get_logger("bus.embedded")
MAX_MISSES = 16  # files vanishing under a read this many times in a row means damage, not retention or compaction


class PartitionLog:
    """Appends to and reads from one partition directory; safe for several processes at once."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        fsync: bool,
        verify_crc: bool = False,
        retention_ms: int | None = None,
        compaction: CompactionPolicy | None = None,
        stable_offset: Callable[[], int | None] | None = None,
    ) -> None:
        """``compaction``: the topic's policy if it is compacted; ``stable_offset``: see ``Compactor``."""
        self.directory = directory
        self.retention_ms = retention_ms
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.verify_crc = verify_crc
        directory.mkdir(parents=True, exist_ok=True)
        self._dir = str(directory)
        self._lock_path = directory / "lock"
        self._bases: list[int] = [0]
        self._compacted: frozenset[int] = frozenset()
        self._listed = False  # whether _bases came from a listing (else it is the guess for an empty partition)
        self._empty = True  # the last listing found no segment
        self._tail: tuple[int, int, int, int] | None = None  # base, index size, log size, last ts after our append
        self._rolled = False
        self._compactor = (
            Compactor(directory, compaction, fsync=fsync, stable_offset=stable_offset) if compaction else None
        )

    # ---------------------------------------------------------------- segments
    def _refresh_segments(self) -> list[int]:
        listing = list_segments(self._dir)
        self._bases = listing.bases or [0]
        self._compacted = listing.compacted
        self._listed, self._empty = True, not listing.bases
        return self._bases

    def _paths(self, base: int) -> tuple[str, str]:
        return segment_path(self._dir, base, LOG), segment_path(self._dir, base, INDEX)

    def _entries(self, base: int) -> int:
        """Records in the live segment at ``base``; ``FileNotFoundError`` if its index is gone."""
        return os.stat(segment_path(self._dir, base, INDEX)).st_size // INDEX_ENTRY.size

    def _compacted_end(self, base: int) -> int:
        path = segment_path(self._dir, base, COMPACTED)
        fd = os.open(path, os.O_RDONLY)
        try:
            return read_footer(fd, path).end
        finally:
            os.close(fd)

    def _active(self) -> tuple[int, int]:
        """(base, records) of the newest segment, listing the directory only when the cached one is gone or full."""
        bases = self._bases if self._listed else self._refresh_segments()
        while True:
            base = bases[-1]
            if base in self._compacted:  # never newest but for a crash, or a stale listing: append after it
                try:
                    end = self._compacted_end(base)
                except FileNotFoundError:
                    bases = self._refresh_segments()
                    continue
                if not os.path.exists(segment_path(self._dir, end, INDEX)):
                    return end, 0
                bases = self._refresh_segments()
                continue
            try:
                entries = self._entries(base)
            except FileNotFoundError:  # removed since we listed (or never there: an empty partition)
                bases = self._refresh_segments()
                if self._empty:
                    return 0, 0
                continue
            if not entries or not os.path.exists(segment_path(self._dir, base + entries, INDEX)):
                return base, entries
            bases = self._refresh_segments()  # another process rolled a new segment

    def start_offset(self) -> int:
        """The first offset still held (older segments may have been deleted by retention)."""
        if self._listed and not self._empty:
            base = self._bases[0]
            if os.path.exists(segment_path(self._dir, base, COMPACTED if base in self._compacted else INDEX)):
                return base  # nothing can appear before the first segment
        return self._refresh_segments()[0]

    def end_offset(self) -> int:
        """The offset the next record will get."""
        base, entries = self._active()
        return base + entries

    # ---------------------------------------------------------------- writing
    def append(self, records: list[PendingRecord]) -> int:
        """Append ``records`` atomically with respect to readers; return the offset of the first one."""
        with file_lock(self._lock_path):
            first = self.append_locked(records)
        self.after_append()
        return first

    def append_locked(self, records: list[PendingRecord]) -> int:
        """``append`` for a caller that already holds this partition's lock (transactions); the caller runs
        ``after_append`` once it has released the lock."""
        base, _ = self._active()
        fds: tuple[int, ...] = self._open_segment(base, truncate_log=False)
        try:
            entries, log_end, last_ts = self._recover_tail(base, *fds)
            if log_end >= self.segment_bytes and entries:
                self._close(fds)
                fds = ()
                base, entries, log_end = base + entries, 0, 0
                self._rolled = True
                self._expire_locked()  # before the new segment exists, so the one just closed is kept
                # truncating drops the frames of a writer that died mid-roll, before the new index existed
                fds = self._open_segment(base, truncate_log=True)
            first = base + entries
            pieces, index, log_end, last_ts = self._frames(first, records, log_end, last_ts)
            self._tail = None  # until both writes completed
            self._write(fds[0], pieces)
            self._write(fds[1], [index])
            self._tail = (base, (entries + len(records)) * INDEX_ENTRY.size, log_end, last_ts)
            if self._bases[-1] < base:  # we rolled: the new segment is the newest
                self._bases = [*self._bases, base]
            return first
        finally:
            self._close(fds)

    @staticmethod
    def _frames(
        first: int, records: list[PendingRecord], position: int, last_ts: int
    ) -> tuple[list[bytes], bytes, int, int]:
        """Frames and index entries of ``records`` from offset ``first`` at log ``position``; the new log end and
        running max timestamp."""
        pieces: list[bytes] = []
        index: list[bytes] = []
        for i, record in enumerate(records):
            frame = encode_frame(first + i, record)
            last_ts = max(last_ts, record.timestamp_ms)
            index.append(INDEX_ENTRY.pack(position, last_ts))
            pieces.extend(frame)
            position += HEAD_SIZE + len(frame[2]) + len(frame[3])
        return pieces, b"".join(index), position, last_ts

    @staticmethod
    def _close(fds: tuple[int, ...]) -> None:
        for fd in fds:
            os.close(fd)

    def after_append(self) -> None:
        """Wake this process's waiting consumers; compact if an append rolled a segment (never raises: its records
        are written whatever happens here)."""
        wakeup.notify()
        if not self._rolled:
            return
        self._rolled = False
        if self._compactor is None:
            return
        try:
            self._compactor.run(force=False)
        except Exception as exc:  # noqa: BLE001 - a failed compaction changes nothing; the next roll retries it
            log.warning("compaction failed", directory=self._dir, error=str(exc))
        self._refresh_segments()

    def _open_segment(self, base: int, *, truncate_log: bool) -> tuple[int, int]:
        log_path, index_path = self._paths(base)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
        log_fd = os.open(log_path, flags | (os.O_TRUNC if truncate_log else 0), 0o644)
        try:
            return log_fd, os.open(index_path, flags, 0o644)
        except BaseException:
            os.close(log_fd)
            raise

    def _write(self, fd: int, pieces: list[bytes]) -> None:
        write_pieces(fd, pieces)
        if self.fsync:
            os.fsync(fd)

    def _recover_tail(self, base: int, log_fd: int, index_fd: int) -> tuple[int, int, int]:
        """Drop a torn tail left by a dead writer; return (entries, log end position, last max timestamp)."""
        index_size, log_size = os.fstat(index_fd).st_size, os.fstat(log_fd).st_size
        tail = self._tail
        if tail is not None and tail[:3] == (base, index_size, log_size):
            return index_size // INDEX_ENTRY.size, log_size, tail[3]  # nobody wrote since our own append
        whole = index_size - index_size % INDEX_ENTRY.size
        if whole != index_size:
            os.ftruncate(index_fd, whole)
        if whole == 0:
            if log_size:
                os.ftruncate(log_fd, 0)
            return 0, 0, -1
        position, last_ts = INDEX_ENTRY.unpack(os.pread(index_fd, INDEX_ENTRY.size, whole - INDEX_ENTRY.size))
        body_len, _ = FRAME_HEAD.unpack(os.pread(log_fd, FRAME_HEAD.size, position))
        log_end = position + FRAME_HEAD.size + body_len
        if log_size != log_end:
            os.ftruncate(log_fd, log_end)
        return whole // INDEX_ENTRY.size, log_end, last_ts

    # ---------------------------------------------------------------- reading
    def read(self, offset: int, max_records: int, max_bytes: int = READ_CHUNK) -> list[StoredRecord]:
        """Read up to ``max_records`` indexed records from ``offset`` (at least one if any is there).

        An offset compacted away reads from the next record there is. A segment that retention or compaction
        removed after the last listing is noticed (its file is missing) and the directory listed again.
        """
        bases = self._bases if self._listed else self._refresh_segments()
        misses = 0
        while True:
            slot = bisect_right(bases, offset) - 1
            if slot < 0:
                bases = self._refresh_segments()
                slot = bisect_right(bases, offset) - 1
                if slot < 0:
                    raise BusError(f"offset {offset} is before the start of {self.directory} ({bases[0]})")
            base = bases[slot]
            try:
                batch, end = self._read_segment(base, offset, max_records, max_bytes)
            except FileNotFoundError as exc:  # removed since we listed (or never there: an empty partition)
                bases = self._refresh_segments()
                if self._empty:
                    return []
                misses += 1
                if misses > MAX_MISSES:  # not a race any more: a file of a listed segment is missing
                    raise BusError(f"segment file {exc.filename} of {self.directory} is missing") from exc
                offset = max(offset, bases[0])  # retention may have deleted what we had not read yet
                continue
            if batch:
                return batch
            if slot + 1 < len(bases):
                offset = max(offset, bases[slot + 1])
                continue
            if end == base or not os.path.exists(segment_path(self._dir, end, INDEX)):
                return []  # at the end of the newest segment
            bases = self._refresh_segments()  # another process rolled a new segment

    def _read_segment(self, base: int, offset: int, max_records: int, max_bytes: int) -> tuple[list[StoredRecord], int]:
        """Records of the segment at ``base`` from ``offset`` on, and the offset after its end."""
        if base in self._compacted:
            return self._read_compacted(base, offset, max_records, max_bytes)
        log_path, index_path = self._paths(base)
        index_fd = os.open(index_path, os.O_RDONLY)
        try:
            end = base + os.fstat(index_fd).st_size // INDEX_ENTRY.size
            if offset >= end:
                return [], end
            first_pos = INDEX_ENTRY.unpack(os.pread(index_fd, INDEX_ENTRY.size, (offset - base) * INDEX_ENTRY.size))[0]
        finally:
            os.close(index_fd)
        with open(log_path, "rb") as frames:
            frames.seek(first_pos)
            return self._parse(frames.read, min(end - offset, max_records), max_bytes), end

    def _read_compacted(
        self, base: int, offset: int, max_records: int, max_bytes: int
    ) -> tuple[list[StoredRecord], int]:
        path = segment_path(self._dir, base, COMPACTED)
        with open(path, "rb") as handle:  # one file: whatever replaces it later, this read sees one version
            footer = read_footer(handle.fileno(), path)
            first = footer.search(handle.fileno(), offset)
            if first == footer.count:
                return [], footer.end
            handle.seek(footer.entry(handle.fileno(), first)[1])
            return self._parse(handle.read, min(footer.count - first, max_records), max_bytes), footer.end

    def _parse(self, read: Callable[[int], bytes], count: int, max_bytes: int) -> list[StoredRecord]:
        return parse_frames(read, count, max_bytes, verify_crc=self.verify_crc, where=self.directory)

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset whose timestamp (as a running maximum) is at or after ``timestamp_ms``, else the end.

        The end is read before the search: a record appended meanwhile is then either found or at/after that end,
        so a consumer starting here never skips a record at or after ``timestamp_ms``.
        """
        end = self.end_offset()
        for base in list(self._refresh_segments()):
            try:
                found = self._first_at_or_after(base, timestamp_ms)
            except FileNotFoundError:
                continue
            if found is not None:
                return found
        return end

    def _first_at_or_after(self, base: int, timestamp_ms: int) -> int | None:
        """Offset of the first record of one segment whose running max timestamp reaches ``timestamp_ms``."""
        if base in self._compacted:
            path = segment_path(self._dir, base, COMPACTED)
            with open(path, "rb") as handle:
                data = read_footer(handle.fileno(), path).table(handle.fileno())
            entry, ts_field = TABLE_ENTRY, 2
        else:
            with open(self._paths(base)[1], "rb") as handle:
                data = handle.read()
            entry, ts_field = INDEX_ENTRY, 1
        entries = len(data) // entry.size
        lo, hi = 0, entries
        while lo < hi:  # running maxima are sorted, so a binary search finds the first match
            mid = (lo + hi) // 2
            if entry.unpack_from(data, mid * entry.size)[ts_field] >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        if lo == entries:
            return None
        return entry.unpack_from(data, lo * entry.size)[0] if entry is TABLE_ENTRY else base + lo

    def records_with_tag(self, start: int, tag: int) -> int:
        """How many records written by transaction ``tag`` exist from offset ``start`` on."""
        found, offset = 0, max(start, self.start_offset())
        while batch := self.read(offset, 10_000):
            found += sum(1 for record in batch if record.txn_tag == tag)
            offset = batch[-1].offset + 1
        return found

    # ---------------------------------------------------------------- compaction
    def compact(self, now_ms: int | None = None) -> CompactionResult:
        """Compact the closed segments now (compacted topics only; it also runs by itself after a roll).

        Call without holding this partition's lock.
        """
        if self._compactor is None:
            return NOTHING
        result = self._compactor.run(force=True, now_ms=now_ms)
        self._refresh_segments()
        return result

    # ---------------------------------------------------------------- retention
    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole closed segments whose newest record is older than ``retention_ms``; return how many.

        Runs by itself whenever a segment rolls; call it to apply retention to a partition no one writes to.
        """
        with file_lock(self._lock_path):
            return self._expire_locked(now_ms)

    def _expire_locked(self, now_ms: int | None = None) -> int:
        if self.retention_ms is None:
            return 0
        cutoff = (now_ms if now_ms is not None else clock.now_ms()) - self.retention_ms
        segments, superseded = walk(self._dir, list_segments(self._dir))
        unlink_all(superseded)
        deleted = 0
        for segment in segments[:-1]:  # the active segment is never deleted
            if segment.last_ts is not None and segment.last_ts >= cutoff:
                break
            unlink_all(segment.files)  # its index (or compacted file) first: no listing sees half a segment
            deleted += 1
        self._refresh_segments()
        return deleted
