"""One partition's log: segment files of framed records plus a dense index, appended under a file lock.

Layout of a partition directory: ``<base>.log`` holds frames, ``<base>.idx`` holds one 16-byte entry per
record (position in the log, highest timestamp so far), ``lock`` serialises writers across processes.

Why it survives ``kill -9`` of a writer: a record becomes visible (and is acknowledged) only after its index
entry is written, and index entries are written after the frames they point at. A writer that dies mid-append
leaves, at worst, a torn tail past the last indexed record; the next writer truncates it before appending.
Readers only ever read indexed records, so they never see a torn frame.

Frame: ``<I body_len><I crc32(body)>`` then body = ``<q offset><q timestamp><Q txn_tag><i key_len><i value_len>``
key, value. ``txn_tag`` identifies the transaction a record was written by (0 outside transactions), which lets
an interrupted transaction be completed without writing any of its records twice.
"""

from __future__ import annotations

import os
import struct
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from orchard import clock
from orchard.bus.embedded.locks import file_lock
from orchard.bus.exceptions import BusError

FRAME_HEAD = struct.Struct("<II")
BODY_HEAD = struct.Struct("<qqQii")
INDEX_ENTRY = struct.Struct("<Qq")
HEAD_SIZE = FRAME_HEAD.size + BODY_HEAD.size
READ_CHUNK = 4 * 1024 * 1024
IOV_BATCH = 512


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record as stored in a partition log."""

    offset: int
    timestamp_ms: int
    txn_tag: int
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class PendingRecord:
    """A record waiting to be appended."""

    key: bytes | None
    value: bytes
    timestamp_ms: int
    txn_tag: int = 0


def encode_frame(offset: int, record: PendingRecord) -> list[bytes]:
    """Frame one record for the log, as pieces to be written in order (no copy of the value)."""
    key = record.key or b""
    key_len = -1 if record.key is None else len(key)
    head = BODY_HEAD.pack(offset, record.timestamp_ms, record.txn_tag, key_len, len(record.value))
    crc = zlib.crc32(record.value, zlib.crc32(key, zlib.crc32(head)))
    return [FRAME_HEAD.pack(len(head) + len(key) + len(record.value), crc), head, key, record.value]


def write_pieces(fd: int, pieces: list[bytes]) -> None:
    """Write ``pieces`` in order with as few system calls as possible and without joining them."""
    for start in range(0, len(pieces), IOV_BATCH):
        batch = pieces[start : start + IOV_BATCH]
        expected = sum(len(piece) for piece in batch)
        written = os.writev(fd, batch)
        if written != expected:  # short write (rare on regular files): finish it plainly
            rest = b"".join(batch)[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


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
    ) -> None:
        self.directory = directory
        self.retention_ms = retention_ms
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.verify_crc = verify_crc
        directory.mkdir(parents=True, exist_ok=True)
        self._lock_path = directory / "lock"
        self._bases: list[int] = []

    # ---------------------------------------------------------------- segments
    def _refresh_segments(self) -> list[int]:
        bases = sorted(int(name[:-4]) for name in os.listdir(self.directory) if name.endswith(".idx"))
        self._bases = bases or [0]
        return self._bases

    def _paths(self, base: int) -> tuple[Path, Path]:
        stem = self.directory / f"{base:020d}"
        return stem.with_suffix(".log"), stem.with_suffix(".idx")

    @staticmethod
    def _entries(index_path: Path) -> int:
        try:
            return os.stat(index_path).st_size // INDEX_ENTRY.size
        except FileNotFoundError:
            return 0

    def start_offset(self) -> int:
        """The first offset still held (older segments may have been deleted by retention)."""
        return self._refresh_segments()[0]

    def end_offset(self) -> int:
        """The offset the next record will get."""
        base = self._refresh_segments()[-1]
        return base + self._entries(self._paths(base)[1])

    # ---------------------------------------------------------------- writing
    def append(self, records: list[PendingRecord]) -> int:
        """Append ``records`` atomically with respect to readers; return the offset of the first one."""
        with file_lock(self._lock_path):
            return self.append_locked(records)

    def append_locked(self, records: list[PendingRecord]) -> int:
        """``append`` for a caller that already holds this partition's lock (transactions)."""
        base = self._refresh_segments()[-1]
        log_path, index_path = self._paths(base)
        entries, log_end, last_ts = self._recover_tail(log_path, index_path)
        if log_end >= self.segment_bytes and entries:
            base, entries, log_end = base + entries, 0, 0
            log_path, index_path = self._paths(base)
            if log_path.exists():  # frames of a writer that died mid-roll, before the new index existed
                os.truncate(log_path, 0)
            self._expire_locked()
        first = base + entries
        pieces: list[bytes] = []
        index: list[bytes] = []
        position = log_end
        for i, record in enumerate(records):
            frame = encode_frame(first + i, record)
            last_ts = max(last_ts, record.timestamp_ms)
            index.append(INDEX_ENTRY.pack(position, last_ts))
            pieces.extend(frame)
            position += HEAD_SIZE + len(frame[2]) + len(frame[3])
        self._write(log_path, pieces)
        self._write(index_path, [b"".join(index)])
        return first

    def _write(self, path: Path, pieces: list[bytes]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            write_pieces(fd, pieces)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _recover_tail(self, log_path: Path, index_path: Path) -> tuple[int, int, int]:
        """Drop a torn tail left by a dead writer; return (entries, log end position, last max timestamp)."""
        index_size = self._entries(index_path) * INDEX_ENTRY.size
        if index_path.exists() and os.stat(index_path).st_size != index_size:
            os.truncate(index_path, index_size)
        if index_size == 0:
            if log_path.exists() and os.stat(log_path).st_size:
                os.truncate(log_path, 0)
            return 0, 0, -1
        with open(index_path, "rb") as handle:
            handle.seek(index_size - INDEX_ENTRY.size)
            position, last_ts = INDEX_ENTRY.unpack(handle.read(INDEX_ENTRY.size))
        with open(log_path, "rb") as handle:
            handle.seek(position)
            body_len, _ = FRAME_HEAD.unpack(handle.read(FRAME_HEAD.size))
        log_end = position + FRAME_HEAD.size + body_len
        if os.stat(log_path).st_size != log_end:
            os.truncate(log_path, log_end)
        return index_size // INDEX_ENTRY.size, log_end, last_ts

    # ---------------------------------------------------------------- reading
    def read(self, offset: int, max_records: int, max_bytes: int = READ_CHUNK) -> list[StoredRecord]:
        """Read up to ``max_records`` indexed records from ``offset`` (at least one if any is there)."""
        bases = self._bases if self._bases and offset < self._bases[-1] else self._refresh_segments()
        slot = bisect_right(bases, offset) - 1
        if slot < 0:
            raise BusError(f"offset {offset} is before the start of {self.directory} ({bases[0]})")
        base = bases[slot]
        log_path, index_path = self._paths(base)
        available = self._entries(index_path) - (offset - base)
        if available <= 0:
            if slot + 1 < len(bases):
                return self.read(bases[slot + 1], max_records, max_bytes)
            return []
        count = min(available, max_records)
        try:
            with open(index_path, "rb") as idx:
                idx.seek((offset - base) * INDEX_ENTRY.size)
                first_pos = INDEX_ENTRY.unpack(idx.read(INDEX_ENTRY.size))[0]
            with open(log_path, "rb") as log:
                log.seek(first_pos)
                return self._parse(log, count, max_bytes)
        except FileNotFoundError:  # the segment was deleted by retention while we read
            return self.read(self.start_offset(), max_records, max_bytes)

    def _parse(self, log: BinaryIO, count: int, max_bytes: int) -> list[StoredRecord]:
        read = log.read
        out: list[StoredRecord] = []
        consumed = 0
        while len(out) < count and (not out or consumed < max_bytes):
            head = read(HEAD_SIZE)
            body_len, crc, offset, ts, tag, key_len, value_len = FRAME_HEAD.unpack_from(head) + BODY_HEAD.unpack_from(
                head, FRAME_HEAD.size
            )
            key = None if key_len < 0 else read(key_len)
            value = read(value_len)
            if self.verify_crc:
                actual = zlib.crc32(value, zlib.crc32(key or b"", zlib.crc32(head[FRAME_HEAD.size :])))
                if actual != crc:
                    raise BusError(f"corrupt frame at offset {offset} of {self.directory} (disk damage?)")
            out.append(StoredRecord(offset, ts, tag, key, value))
            consumed += FRAME_HEAD.size + body_len
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """First offset whose timestamp (as a running maximum) is at or after ``timestamp_ms``, else the end.

        The end is read before the search: a record appended meanwhile is then either found or at/after that end,
        so a consumer starting here never skips a record at or after ``timestamp_ms``.
        """
        end = self.end_offset()
        for base in self._refresh_segments():
            _, index_path = self._paths(base)
            try:
                data = index_path.read_bytes()
            except FileNotFoundError:
                continue
            entries = len(data) // INDEX_ENTRY.size
            lo, hi = 0, entries
            while lo < hi:  # running maxima are sorted, so a binary search finds the first match
                mid = (lo + hi) // 2
                if INDEX_ENTRY.unpack_from(data, mid * INDEX_ENTRY.size)[1] >= timestamp_ms:
                    hi = mid
                else:
                    lo = mid + 1
            if lo < entries:
                return base + lo
        return end

    def records_with_tag(self, start: int, tag: int) -> int:
        """How many records written by transaction ``tag`` exist from offset ``start`` on."""
        found, offset = 0, max(start, self.start_offset())
        while batch := self.read(offset, 10_000):
            found += sum(1 for record in batch if record.txn_tag == tag)
            offset = batch[-1].offset + 1
        return found

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
        deleted = 0
        bases = self._refresh_segments()
        for base in bases[:-1]:  # the active segment is never deleted
            log_path, index_path = self._paths(base)
            data = index_path.read_bytes()
            if data and INDEX_ENTRY.unpack_from(data, len(data) - INDEX_ENTRY.size)[1] >= cutoff:
                break
            index_path.unlink()
            log_path.unlink(missing_ok=True)
            deleted += 1
        self._refresh_segments()
        return deleted
