"""Avro single-object encoding of bus records, over the catalog of every released schema version
(``orchard.schema_catalog``, whose names ``SchemaCatalog``, ``SchemaVersion`` and ``MARKER`` this module also offers).

A record on the bus is, per the Avro specification's *single-object encoding*::

    C3 01 | CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form (8 bytes, little-endian) | body

The body is plain Avro binary (fastavro ``schemaless_writer``). The catalog (``schemas/<Name>/v<N>.avsc``) knows every
released version by fingerprint, so a reader finds the writer schema from the header and resolves the body to the
current version of that name. Departures from a bare fastavro round trip, and why:

- encode validates the record first (fastavro's writer silently truncates ``1.5`` or ``2**40`` into an ``int``) and
  rejects unknown fields; omitted fields that have a default get it;
- packed array fields (``"orchard.packed"`` in the schema) accept numpy arrays or sequences and are packed on encode;
  on decode their length is checked, so a bad length is a ``CorruptRecordError`` here, not a crash in a consumer;
- defaults filled in for fields the writer lacked are converted as Avro says (a ``bytes`` default is a latin-1 JSON
  string, a ``timestamp-millis`` default a number) and copied per record; fastavro returns the raw JSON value, shared.

Timestamps decode to timezone-aware UTC ``datetime``; encode takes a timezone-aware ``datetime`` or an ``int`` of
milliseconds (a naive ``datetime`` is refused: fastavro would silently read it as local time). Two versions with the
same canonical form (only docs or defaults changed) share a fingerprint; ``DecodedRecord.writer_version`` then names
the older one.
"""

from __future__ import annotations

import array
import base64
import copy
import functools
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Final

import fastavro
import fastavro.read
import fastavro.validation
import numpy as np

from orchard.schema_catalog import MARKER, SchemaCatalog, SchemaVersion, unknown_fingerprint_error
from orchard.serialization_errors import (
    CorruptRecordError,
    IncompatibleSchemaError,
    PackedArrayError,
    SchemaValidationError,
    UnknownSchemaError,
)
from orchard.tokens import PACKED_DTYPES, pack_array, unpack_array
from schemas import SCHEMA_DIR

HEADER_SIZE: Final[int] = 10
"""Marker plus 8-byte fingerprint."""
_MAX_ERROR_CHARS = 300


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A decoded record: its schema name, the version it was written with and read as, and its fields."""

    name: str
    writer_version: int
    reader_version: int
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _ReadPlan:
    writer: SchemaVersion
    reader: SchemaVersion
    reader_parsed: dict[str, Any] | None
    filled_defaults: tuple[tuple[str, Any], ...]
    packed: tuple[tuple[str, str, int], ...]  # the reader's packed fields: name, kind, item size


class Codec:
    """Encodes records with the current schema version of their name and decodes any version in the catalog."""

    def __init__(self, catalog: SchemaCatalog, *, versions: Mapping[str, int] | None = None) -> None:
        """Build a codec; ``versions`` pins the version a name is written and read with (an older process)."""
        self.catalog = catalog
        pins = dict(versions or {})
        self._schemas = {
            name: catalog.get(name, pins.pop(name)) if name in pins else catalog.current(name)
            for name in catalog.names()
        }
        if pins:
            raise UnknownSchemaError(f"cannot pin unknown schema names {sorted(pins)}")
        self._plans = {sv.fingerprint_bytes: _read_plan(sv, self._schemas[sv.name]) for sv in catalog}
        self._writers = {name: _RecordWriter(sv) for name, sv in self._schemas.items()}

    @classmethod
    def default(cls) -> Codec:
        """The codec over the shipped catalog, built once per process."""
        return _default_codec()

    def schema(self, name: str) -> SchemaVersion:
        """The version ``name`` is written and read with."""
        try:
            return self._schemas[name]
        except KeyError:
            raise UnknownSchemaError(f"no schema named {name!r} in the catalog") from None

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        """Validate and encode ``record`` as a single-object ``name`` record; raise ``SchemaValidationError``."""
        sv = self.schema(name)
        writer = self._writers[name]
        prepared = writer.prepare(record)
        problems = writer.problems(prepared)
        if problems:
            raise SchemaValidationError(f"{name} v{sv.version}: " + "; ".join(problems))
        out = io.BytesIO()
        out.write(sv.header)
        try:
            fastavro.schemaless_writer(out, sv.parsed, prepared)
        except Exception as exc:  # whatever the checks above let through, fastavro's writer refuses
            raise SchemaValidationError(f"{name} v{sv.version}: {_truncate(str(exc))}") from exc
        return out.getvalue()

    def decode(self, data: bytes | bytearray | memoryview) -> DecodedRecord:
        """Decode one single-object record into the reader version of its name; every failure is a
        ``SerializationError``."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if len(data) < HEADER_SIZE:
            raise CorruptRecordError(f"record of {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
        if data[:2] != MARKER:
            raise CorruptRecordError(f"bad single-object marker {data[:2].hex()} (expected {MARKER.hex()})")
        plan = self._plans.get(data[2:HEADER_SIZE])
        if plan is None:
            raise unknown_fingerprint_error(data[2:HEADER_SIZE], self.catalog.schema_dir)
        record = _read_body(data, plan)
        _check_packed_lengths(plan, record)
        return DecodedRecord(plan.reader.name, plan.writer.version, plan.reader.version, record)

    def to_json_dict(self, decoded: DecodedRecord) -> dict[str, Any]:
        """``to_json_dict`` over this codec's catalog."""
        return to_json_dict(decoded, self.catalog)


@functools.cache
def _default_codec() -> Codec:
    return Codec(SchemaCatalog.load(SCHEMA_DIR))


def to_json_dict(decoded: DecodedRecord, catalog: SchemaCatalog | None = None) -> dict[str, Any]:
    """A JSON-serialisable copy of ``decoded.record``: packed arrays unpacked into lists (as the schema marks them),
    other bytes in base64, datetimes in ISO 8601. ``catalog`` defaults to the shipped one."""
    catalog = catalog if catalog is not None else Codec.default().catalog
    packed = catalog.get(decoded.name, decoded.reader_version).packed_fields
    out: dict[str, Any] = {}
    for key, value in decoded.record.items():
        kind = packed.get(key)
        out[key] = unpack_array(value, kind).tolist() if kind and isinstance(value, bytes) else _jsonable(value)
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)  # Decimal, UUID, time


_FieldCheck = Callable[[Any], bool]
_INT32_RANGE: Final = (-(2**31), 2**31 - 1)
_INT64_RANGE: Final = (-(2**63), 2**63 - 1)


def _integer_check(low: int, high: int) -> _FieldCheck:
    return lambda v: isinstance(v, int | np.integer) and not isinstance(v, bool) and bool(low <= v <= high)


_PRIMITIVE_CHECKS: Final[dict[str, _FieldCheck]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool | np.bool_),
    "int": _integer_check(*_INT32_RANGE),
    "long": _integer_check(*_INT64_RANGE),
    "float": lambda v: isinstance(v, float | int | np.floating | np.integer) and not isinstance(v, bool),
    "double": lambda v: isinstance(v, float | int | np.floating | np.integer) and not isinstance(v, bool),
    "bytes": lambda v: isinstance(v, bytes | bytearray),
    "string": lambda v: isinstance(v, str),
}
_TIMESTAMP_TYPES: Final = frozenset({"timestamp-millis", "timestamp-micros", "local-timestamp-millis"})


class _RecordWriter:
    """Prepares and checks a record before fastavro writes it.

    ``prepare`` packs array-valued packed fields and fills omitted defaulted fields with their decoded-form default
    (fastavro's writer fails on a ``bytes`` field's JSON default). ``problems`` checks top-level fields with
    precompiled predicates, stricter than fastavro's writer (which silently truncates ``1.5`` or ``2**40`` into an
    ``int``) and several times faster than ``fastavro.validation.validate``, which is left the complex fields."""

    def __init__(self, sv: SchemaVersion) -> None:
        """Precompile the checks and defaults of ``sv``."""
        named = sv.parsed.get("__named_schemas", {})
        self._sv = sv
        self._fields = [
            (fld["name"], "default" in fld, _field_check(fld["type"], named), _describe(fld["type"]))
            for fld in sv.parsed["fields"]
        ]
        self._defaults = [
            (fld["name"], _python_default(fld["type"], fld["default"], named))
            for fld in sv.parsed["fields"]
            if "default" in fld
        ]
        self._known = frozenset(fld["name"] for fld in sv.parsed["fields"])
        self._has_complex = any(check is None for _, _, check, _ in self._fields)

    def prepare(self, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """``record``, or a copy with packed fields packed and omitted defaults filled in."""
        if not isinstance(record, Mapping):
            return record  # ``problems`` reports it
        prepared: dict[str, Any] | None = None
        for name, kind in self._sv.packed_fields.items():
            value = record.get(name)
            if value is None or isinstance(value, bytes):
                continue
            try:
                packed = pack_array(value, kind)
            except PackedArrayError as exc:
                raise SchemaValidationError(f"{self._sv.name} v{self._sv.version}: field {name}: {exc}") from exc
            prepared = prepared if prepared is not None else dict(record)
            prepared[name] = packed
        for name, default in self._defaults:
            if name not in record:
                prepared = prepared if prepared is not None else dict(record)
                prepared[name] = default
        return prepared if prepared is not None else record

    def problems(self, record: Mapping[str, Any]) -> list[str]:
        """Human-readable problems of ``record``; empty when it can be written."""
        if not isinstance(record, Mapping):
            return [f"expected a mapping, got {type(record).__name__}"]
        problems = []
        for name, has_default, check, expected in self._fields:
            if name not in record:
                if not has_default:
                    problems.append(f"{name}: missing (the field has no default)")
            elif check is not None and not check(record[name]):
                value = record[name]
                problems.append(f"{name}: expected {expected}, got {type(value).__name__} {_truncate(repr(value), 80)}")
        for name, kind in self._sv.packed_fields.items():
            value = record.get(name)
            if isinstance(value, bytes) and len(value) % PACKED_DTYPES[kind].itemsize:
                problems.append(f"field {name}: {len(value)} bytes is not a whole number of {kind} values")
        if not self._known.issuperset(record):
            problems.append(f"unknown fields {sorted(set(record) - self._known)}")
        if self._has_complex and not problems:
            try:
                fastavro.validation.validate(record, self._sv.parsed, raise_errors=True)
            except fastavro.validation.ValidationError as exc:
                problems.extend(_truncate(str(err)) for err in exc.errors)
        return problems


def _field_check(schema: Any, named: Mapping[str, Any]) -> _FieldCheck | None:
    """A predicate for values of ``schema``, or None when only fastavro can tell."""
    if isinstance(schema, str) and schema in named:
        schema = named[schema]
    if isinstance(schema, list):
        branches = [_field_check(branch, named) for branch in schema]
        if any(check is None for check in branches):
            return None
        checks = tuple(check for check in branches if check is not None)
        return lambda v: any(check(v) for check in checks)
    if isinstance(schema, str):
        return _PRIMITIVE_CHECKS.get(schema)
    logical = schema.get("logicalType")
    if logical in _TIMESTAMP_TYPES and schema["type"] == "long":
        is_long = _PRIMITIVE_CHECKS["long"]
        return lambda v: (isinstance(v, datetime) and v.tzinfo is not None) or is_long(v)
    if schema["type"] == "enum":
        symbols = frozenset(schema["symbols"])
        return lambda v: isinstance(v, str) and v in symbols
    if schema["type"] == "array" and logical is None:
        items = _field_check(schema["items"], named)
        if items is None:
            return None
        # what fastavro's validator accepts as an array (a Trajectory's calls: thousands of bytes values)
        return lambda v: isinstance(v, Sequence | array.array) and not isinstance(v, str) and all(map(items, v))
    return _PRIMITIVE_CHECKS.get(schema["type"]) if logical is None else None


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return " or ".join(_describe(branch) for branch in schema)
    if isinstance(schema, str):
        return schema.rsplit(".", 1)[-1]
    if schema["type"] == "enum":
        return f"one of {schema['symbols']}"
    if schema.get("logicalType") in _TIMESTAMP_TYPES:
        return f"timezone-aware datetime or int ({schema['logicalType']})"
    return str(schema["type"])


def _read_body(data: bytes, plan: _ReadPlan) -> dict[str, Any]:
    stream = io.BytesIO(data)
    stream.seek(HEADER_SIZE)
    try:
        record = fastavro.schemaless_reader(stream, plan.writer.parsed, plan.reader_parsed)
    except fastavro.read.SchemaResolutionError as exc:
        raise IncompatibleSchemaError(f"{_where(plan)} cannot be read as v{plan.reader.version}: {exc}") from exc
    except Exception as exc:  # a corrupt body makes fastavro raise EOFError, ValueError, IndexError, ...
        reason = f"{type(exc).__name__}: {_truncate(str(exc))}"
        raise CorruptRecordError(f"{_where(plan)} body is unreadable: {reason}") from exc
    if stream.tell() != len(data):
        raise CorruptRecordError(f"{_where(plan)} record has {len(data) - stream.tell()} trailing bytes")
    if not isinstance(record, dict):
        raise CorruptRecordError(f"{_where(plan)} body did not decode to a record")
    for name, default in plan.filled_defaults:
        record[name] = copy.deepcopy(default)
    return record


def _where(plan: _ReadPlan) -> str:
    return f"{plan.writer.name} v{plan.writer.version}"


def _check_packed_lengths(plan: _ReadPlan, record: Mapping[str, Any]) -> None:
    for name, kind, size in plan.packed:
        value = record.get(name)
        if isinstance(value, bytes) and len(value) % size:
            raise CorruptRecordError(f"{plan.reader.name}.{name}: {len(value)} bytes is not a whole number of {kind} "
                                     "values")  # fmt: skip


def _packed(sv: SchemaVersion) -> tuple[tuple[str, str, int], ...]:
    return tuple((name, kind, PACKED_DTYPES[kind].itemsize) for name, kind in sv.packed_fields.items())


def _read_plan(writer: SchemaVersion, reader: SchemaVersion) -> _ReadPlan:
    if writer is reader or writer.canonical_form == reader.canonical_form:
        return _ReadPlan(writer, reader, None, (), _packed(reader))
    writer_fields = {fld["name"] for fld in writer.parsed["fields"]}
    named = reader.parsed.get("__named_schemas", {})
    filled = tuple(
        (fld["name"], _python_default(fld["type"], fld["default"], named))
        for fld in reader.parsed["fields"]
        if "default" in fld and not ({fld["name"], *fld.get("aliases", [])} & writer_fields)
    )
    return _ReadPlan(writer, reader, reader.parsed, filled, _packed(reader))


def _python_default(schema: Any, default: Any, named: Mapping[str, Any]) -> Any:
    """Convert a JSON default into the value fastavro would have decoded for ``schema``."""
    if isinstance(schema, list):
        return _python_default(schema[0], default, named) if schema else default
    if isinstance(schema, str):
        if schema in named:
            return _python_default(named[schema], default, named)
        return default.encode("latin-1") if schema == "bytes" and isinstance(default, str) else default
    kind = schema["type"]
    if kind == "record":
        return {
            fld["name"]: _python_default(fld["type"], default.get(fld["name"], fld.get("default")), named)
            for fld in schema["fields"]
        }
    if kind == "array":
        return [_python_default(schema["items"], item, named) for item in default]
    if kind == "map":
        return {key: _python_default(schema["values"], item, named) for key, item in default.items()}
    if kind == "fixed":
        return default.encode("latin-1")
    logical_reader = fastavro.read.LOGICAL_READERS.get(f"{kind}-{schema.get('logicalType')}")
    base = _python_default(kind, default, named)
    return logical_reader(base, schema, schema) if logical_reader is not None else base


def _truncate(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
