"""The segment files of one partition directory: their names, listing them, and the compacted-segment format.

A live segment is ``<base>.log`` (frames) plus ``<base>.idx`` (one dense ``INDEX_ENTRY`` per record, so entry
``i`` is offset ``base + i``). A compacted segment is a single file, ``<base>.cseg``, so that one rename puts it
in place of the segments it was made from: the surviving frames byte for byte, then one ``TABLE_ENTRY`` (offset,
position, the running maximum timestamp the record had in its original segment) per frame, then a ``FOOTER``.
Offsets in ``[base, end)`` without an entry were compacted away.

What a process that died part-way through compaction or retention leaves, and how it is treated. "Superseded"
files still hold valid (older, uncompacted) copies of records, so a reader that meets one reads correct data; the
next compaction or retention pass deletes them under the partition lock:

- ``<base>.idx`` and ``.log`` beside a ``<base>.cseg``: superseded (the compacted segment wins);
- any segment whose base lies inside a compacted segment's ``[base, end)``: superseded;
- a ``<base>.log`` with no index, below the newest segment: the rest of a deleted segment;
- ``.<base>.cseg.<pid>.tmp``: a compacted segment that was never put in place (deleted by the next compaction).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from orchard.bus.embedded.frames import INDEX_ENTRY, PendingRecord, StoredRecord, encode_frame
from orchard.bus.exceptions import BusError

TABLE_ENTRY = struct.Struct("<qQq")  # offset, position in the file, running max timestamp
FOOTER = struct.Struct("<4sqqqQ")  # magic, base, end, entry count, position of the table
MAGIC = b"OCS1"
INDEX, LOG, COMPACTED, TEMP = ".idx", ".log", ".cseg", ".tmp"


def segment_path(directory: str, base: int, suffix: str) -> str:
    """The path of one file of the segment at ``base`` (string paths: cheaper than ``Path`` on the hot path)."""
    return f"{directory}/{base:020d}{suffix}"


@dataclass(frozen=True, slots=True)
class Listing:
    """What one ``os.listdir`` of a partition directory found."""

    bases: list[int]  # every base with an index or a compacted segment, sorted; empty for an empty partition
    dense: frozenset[int]  # bases with a ``.idx``
    compacted: frozenset[int]  # bases with a ``.cseg``
    logs: frozenset[int]  # bases with a ``.log``
    temps: tuple[str, ...]  # names of compacted segments never put in place


def list_segments(directory: str) -> Listing:
    """List the segment files of ``directory``."""
    found: dict[str, set[int]] = {INDEX: set(), LOG: set(), COMPACTED: set()}
    temps: list[str] = []
    for name in os.listdir(directory):
        stem, dot, suffix = name.rpartition(".")
        if suffix == TEMP[1:] and name.startswith("."):
            temps.append(name)
        elif stem.isdigit() and f"{dot}{suffix}" in found:
            found[f"{dot}{suffix}"].add(int(stem))
    return Listing(
        sorted(found[INDEX] | found[COMPACTED]),
        frozenset(found[INDEX]),
        frozenset(found[COMPACTED]),
        frozenset(found[LOG]),
        tuple(temps),
    )


@dataclass(frozen=True, slots=True)
class CompactedFooter:
    """Where a compacted segment's parts are."""

    base: int
    end: int  # the offset after the last one it covers
    count: int
    table_position: int

    def entry(self, fd: int, i: int) -> tuple[int, int, int]:
        """Table entry ``i``: (offset, position, running max timestamp)."""
        return TABLE_ENTRY.unpack(os.pread(fd, TABLE_ENTRY.size, self.table_position + i * TABLE_ENTRY.size))

    def search(self, fd: int, offset: int) -> int:
        """Index of the first entry at or after ``offset`` (``count`` if there is none)."""
        lo, hi = 0, self.count
        while lo < hi:  # offsets in the table are increasing
            mid = (lo + hi) // 2
            if self.entry(fd, mid)[0] < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def table(self, fd: int) -> bytes:
        """The whole table."""
        return os.pread(fd, self.count * TABLE_ENTRY.size, self.table_position)


def read_footer(fd: int, where: str) -> CompactedFooter:
    """The footer of the compacted segment open as ``fd``; ``BusError`` if it is not one."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, FOOTER.size, size - FOOTER.size) if size >= FOOTER.size else b""
    if len(data) != FOOTER.size or data[:4] != MAGIC:
        raise BusError(f"{where} is not a compacted segment (damaged?)")
    _, base, end, count, table_position = FOOTER.unpack(data)
    return CompactedFooter(base, end, count, table_position)


class CompactedWriter:
    """Writes a compacted segment to a temporary file; ``finish`` completes it (the caller renames it in place)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "wb")  # closed by finish() or discard()
        self._table = bytearray()
        self._position = 0
        self.count = 0

    def add(self, record: StoredRecord, running_ts: int) -> None:
        """Copy ``record`` (same offset, same bytes) with the running max timestamp it had."""
        pieces = encode_frame(
            record.offset, PendingRecord(record.key, record.value, record.timestamp_ms, record.txn_tag)
        )
        self._table += TABLE_ENTRY.pack(record.offset, self._position, running_ts)
        self._file.writelines(pieces)
        self._position += sum(len(piece) for piece in pieces)
        self.count += 1

    def finish(self, base: int, end: int, *, fsync: bool) -> None:
        """Write the table and the footer and close the file (flushed to disk with ``fsync``)."""
        self._file.write(self._table)
        self._file.write(FOOTER.pack(MAGIC, base, end, self.count, self._position))
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())
        self._file.close()

    def discard(self) -> None:
        """Close and delete the unfinished file."""
        self._file.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment as a compaction or retention pass sees it."""

    base: int
    end: int  # the offset after the last one it covers
    compacted: bool
    files: tuple[str, ...]  # its index (or compacted file) first, so deleting in order never leaves an index alone
    frame_bytes: int
    last_ts: int | None  # running max timestamp of its last record; None if it holds none
    inode: int  # of its first file: a compaction checks its sources are still the same files


def dense_segment(directory: str, base: int) -> Segment:
    """The live segment at ``base``."""
    index, log = segment_path(directory, base, INDEX), segment_path(directory, base, LOG)
    with open(index, "rb") as handle:
        stat = os.fstat(handle.fileno())
        entries = stat.st_size // INDEX_ENTRY.size
        last = None
        if entries:
            last = INDEX_ENTRY.unpack(os.pread(handle.fileno(), INDEX_ENTRY.size, (entries - 1) * INDEX_ENTRY.size))[1]
    size = os.stat(log).st_size if entries else 0
    return Segment(base, base + entries, False, (index, log), size, last, stat.st_ino)


def compacted_segment(directory: str, base: int) -> Segment:
    """The compacted segment at ``base``."""
    path = segment_path(directory, base, COMPACTED)
    fd = os.open(path, os.O_RDONLY)
    try:
        footer = read_footer(fd, path)
        last = footer.entry(fd, footer.count - 1)[2] if footer.count else None
        inode = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    return Segment(base, footer.end, True, (path,), footer.table_position, last, inode)


def walk(directory: str, listing: Listing) -> tuple[list[Segment], list[str]]:
    """The segments that hold the partition, in order, and the superseded files (see the module docstring)."""
    segments: list[Segment] = []
    superseded: list[str] = []
    covered = -1
    for base in listing.bases:
        if base < covered:
            suffixes = (COMPACTED, INDEX, LOG) if base in listing.compacted else (INDEX, LOG)
            superseded += [segment_path(directory, base, s) for s in suffixes]
            continue
        if base in listing.compacted:
            if base in listing.dense:
                superseded += [segment_path(directory, base, INDEX), segment_path(directory, base, LOG)]
            segment = compacted_segment(directory, base)
        else:
            segment = dense_segment(directory, base)
        covered = segment.end
        segments.append(segment)
    newest = listing.bases[-1] if listing.bases else 0
    superseded += [segment_path(directory, b, LOG) for b in sorted(listing.logs - listing.dense) if b < newest]
    return segments, list(dict.fromkeys(superseded))


def unlink_all(paths: list[str] | tuple[str, ...]) -> None:
    """Delete ``paths`` in order; one already gone is fine."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
