"""State values that are input records: the changelog stores where the record is, not its bytes.

A processor that keeps an input record exactly as read (the trajectory assembler keeps every model call until its
episode completes) would otherwise write each record's bytes a second time, to the changelog, in the transaction
that consumes it. A reference is a few dozen bytes instead; the input topic already holds the record durably, at an
offset behind the group's committed position, so a restore reads it back from there.

Changelog value of a reference (``consumers.state`` keeps ``b"P"`` + value for plain values)::

    b"R" | <H topic length> topic (logical, UTF-8) | <i partition> <q offset> <I record length> <I crc32 of record>
         | prefix (the bytes the processor put before the record)

The length and CRC-32 are checked when the record is read back, so a topic deleted and recreated under the same
name (other records at the same offsets) cannot restore the wrong bytes. A record the input topic no longer holds
(deleted by retention while its key was still live, or the topic recreated) cannot be restored: its key is left
out of the restored state and reported, never replaced by anything else.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

REF = b"R"
_TOPIC_LENGTH = struct.Struct("<H")
_WHERE = struct.Struct("<iqII")  # partition, offset, record length, crc32 of the record


@dataclass(frozen=True, slots=True)
class InputRef:
    """Where an input record lives: its logical topic, partition and offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class StoredRef:
    """A decoded reference value: the record it points at, its length and CRC-32, and the processor's prefix."""

    source: InputRef
    length: int
    crc: int
    prefix: bytes

    def value(self, record: bytes | None) -> bytes | None:
        """The state value, from the record read back at ``source`` (None if it is missing or another record)."""
        if record is None or len(record) != self.length or zlib.crc32(record) != self.crc:
            return None
        return self.prefix + record


Resolver = Callable[[Iterable[InputRef]], Mapping[InputRef, bytes]]
"""Reads input records back for a restore: the values of those of ``refs`` the input topics still hold."""


def encode_ref(topic: str, partition: int, offset: int, record: bytes, prefix: bytes = b"") -> bytes:
    """The changelog value of ``prefix + record`` where ``record`` is the input at ``topic``, ``partition``,
    ``offset`` (once per input record the assembler keeps: kept to a few small concatenations)."""
    return _ref_head(topic) + _WHERE.pack(partition, offset, len(record), zlib.crc32(record)) + prefix


@functools.cache
def _ref_head(topic: str) -> bytes:
    encoded = topic.encode()
    return REF + _TOPIC_LENGTH.pack(len(encoded)) + encoded


def decode_ref(value: bytes) -> StoredRef:
    """The reference ``encode_ref`` wrote (``value`` starts with ``REF``); ``ValueError`` if it is damaged."""
    try:
        (length,) = _TOPIC_LENGTH.unpack_from(value, len(REF))
        start = len(REF) + _TOPIC_LENGTH.size
        topic = value[start : start + length].decode()
        partition, offset, size, crc = _WHERE.unpack_from(value, start + length)
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"damaged state reference ({len(value)} bytes): {exc}") from exc
    return StoredRef(InputRef(topic, partition, offset), size, crc, value[start + length + _WHERE.size :])
