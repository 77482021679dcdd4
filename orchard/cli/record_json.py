"""Bus records as readable JSON for ``orchard tail``: nested Avro decoded, JSON strings parsed, token arrays unpacked.

What a reader of a topic wants to see, not the wire form:

- a ``bytes`` value that is itself a single-object Avro record of the catalog (a ``Trajectory``'s ``calls`` and
  ``outcome``, a ``DeadLetter``'s ``original``) becomes ``{"schema": "ModelCall/v3", "record": {...}}``, decoded the
  same way, up to ``MAX_DEPTH`` levels; other bytes stay base64 (a poison record's bytes are shown as they are);
- a string field named ``*_json`` (``request_messages_json``, ``details_json``, ...) holding valid JSON becomes that
  JSON value, so messages and tool calls read as objects;
- packed arrays (``"orchard.packed"`` in the schema) become lists, or with ``tokens="summary"`` their length and
  first and last ``SUMMARY_EDGE`` values;
- timestamps become ISO 8601.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final, Literal

from orchard.bus import Record
from orchard.codec import MARKER, Codec, DecodedRecord
from orchard.serialization_errors import SerializationError
from orchard.tokens import unpack_array

TokenMode = Literal["full", "summary"]
MAX_DEPTH: Final[int] = 3
SUMMARY_EDGE: Final[int] = 8
RAW_PREVIEW_BYTES: Final[int] = 256


@dataclass(frozen=True, slots=True)
class Entry:
    """A record read from the bus with its decoded form, or why it did not decode."""

    record: Record
    decoded: DecodedRecord | None
    error: str | None = None

    @classmethod
    def of(cls, record: Record, codec: Codec) -> Entry:
        """Decode ``record``; a record that is not a valid Orchard record keeps its error."""
        try:
            return cls(record, codec.decode(record.value))
        except SerializationError as exc:
            return cls(record, None, f"{type(exc).__name__}: {exc}")

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Newest last: by timestamp, then partition and offset."""
        return self.record.timestamp_ms, self.record.partition, self.record.offset


class RecordRenderer:
    """Turns entries into JSON-ready dicts."""

    def __init__(self, codec: Codec, tokens: TokenMode = "full") -> None:
        self.codec, self.tokens = codec, tokens

    def line(self, entry: Entry) -> dict[str, Any]:
        """One record: position, key, schema and readable fields (or the decode error and the first raw bytes)."""
        record = entry.record
        line: dict[str, Any] = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp_ms,
            "key": None if record.key is None else record.key.decode("utf-8", "backslashreplace"),
        }
        if entry.decoded is None:
            line["error"] = entry.error
            line["raw_base64"] = base64.b64encode(record.value[:RAW_PREVIEW_BYTES]).decode()
            return line
        line["schema"] = _schema_label(entry.decoded)
        line["record"] = self.fields(entry.decoded)
        return line

    def fields(self, decoded: DecodedRecord, depth: int = 0) -> dict[str, Any]:
        """The fields of ``decoded``, each made readable (see the module docstring)."""
        packed = self.codec.catalog.get(decoded.name, decoded.reader_version).packed_fields
        out: dict[str, Any] = {}
        for key, value in decoded.record.items():
            kind = packed.get(key)
            if kind is not None and isinstance(value, bytes):
                out[key] = self._array(unpack_array(value, kind).tolist())
            else:
                out[key] = self._value(key, value, depth)
        return out

    def nested(self, value: bytes, depth: int) -> dict[str, Any] | None:
        """``value`` decoded as a nested Orchard record, or None if it is not one (or nested too deep)."""
        if depth >= MAX_DEPTH or not value.startswith(MARKER):
            return None
        try:
            decoded = self.codec.decode(value)
        except SerializationError:
            return None
        return {"schema": _schema_label(decoded), "record": self.fields(decoded, depth + 1)}

    def _value(self, key: str, value: Any, depth: int) -> Any:
        if isinstance(value, bytes):
            nested = self.nested(value, depth)
            return nested if nested is not None else base64.b64encode(value).decode("ascii")
        if isinstance(value, str) and key.endswith("_json"):
            return _parsed_json(value)
        if isinstance(value, Mapping):
            return {str(k): self._value("", v, depth) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._value("", v, depth) for v in value]
        if isinstance(value, datetime | date):
            return value.isoformat()
        if value is None or isinstance(value, bool | int | float | str):
            return value
        return str(value)

    def _array(self, values: list[Any]) -> Any:
        if self.tokens == "full" or len(values) <= 2 * SUMMARY_EDGE:
            return values
        return {"length": len(values), "first": values[:SUMMARY_EDGE], "last": values[-SUMMARY_EDGE:]}


def field_value(renderer: RecordRenderer, entry: Entry, name: str) -> Any:
    """Field ``name`` of the entry's record, else of the first nested record that has it (a dead letter's
    original); None when neither has it."""
    if entry.decoded is None:
        return None
    record = entry.decoded.record
    if name in record:
        return record[name]
    for value in record.values():
        nested = renderer.nested(value, 0) if isinstance(value, bytes) else None
        if nested is not None and name in nested["record"]:
            return nested["record"][name]
    return None


def _schema_label(decoded: DecodedRecord) -> str:
    return f"{decoded.name}/v{decoded.writer_version}"


def _parsed_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
