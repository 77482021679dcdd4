"""Records as the embedded log stores them: the frame format, and writing and parsing frames.

Frame: ``<I body_len><I crc32(body)>`` then body = ``<q offset><q timestamp><Q txn_tag><i key_len><i value_len>``
key, value. ``txn_tag`` identifies the transaction a record was written by (0 outside transactions), which lets
an interrupted transaction be completed without writing any of its records twice. A frame carries its own
offset, so a reader needs no index to know where a record belongs (compacted segments leave gaps).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from orchard.bus.exceptions import BusError

FRAME_HEAD = struct.Struct("<II")
BODY_HEAD = struct.Struct("<qqQii")
INDEX_ENTRY = struct.Struct("<Qq")  # one per record of a live segment: position in the log, max timestamp so far
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


def parse_frames(
    read: Callable[[int], bytes], count: int, max_bytes: int, *, verify_crc: bool, where: object
) -> list[StoredRecord]:
    """Parse up to ``count`` frames from ``read`` (at least one, then while under ``max_bytes``).

    ``where`` names the log in the error a damaged frame raises when ``verify_crc`` is on.
    """
    out: list[StoredRecord] = []
    consumed = 0
    while len(out) < count and (not out or consumed < max_bytes):
        head = read(HEAD_SIZE)
        body_len, crc, offset, ts, tag, key_len, value_len = FRAME_HEAD.unpack_from(head) + BODY_HEAD.unpack_from(
            head, FRAME_HEAD.size
        )
        key = None if key_len < 0 else read(key_len)
        value = read(value_len)
        if verify_crc:
            actual = zlib.crc32(value, zlib.crc32(key or b"", zlib.crc32(head[FRAME_HEAD.size :])))
            if actual != crc:
                raise BusError(f"corrupt frame at offset {offset} of {where} (disk damage?)")
        out.append(StoredRecord(offset, ts, tag, key, value))
        consumed += FRAME_HEAD.size + body_len
    return out
