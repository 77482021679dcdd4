"""The schema catalog: every released version of every bus record schema (``schemas/<Name>/v<N>.avsc``), parsed
once and indexed by name and by the CRC-64-AVRO (Rabin) fingerprint of its Parsing Canonical Form, the fingerprint a
single-object encoded record carries in its header (``orchard.codec`` encodes and decodes with it)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import fastavro
from fastavro.schema import to_parsing_canonical_form

from orchard.serialization_errors import SchemaCatalogError, UnknownFingerprintError, UnknownSchemaError
from orchard.tokens import PACKED_DTYPES
from schemas import SCHEMA_DIR

MARKER: Final[bytes] = b"\xc3\x01"
"""The two bytes that start every single-object encoded record."""
PACKED_ATTRIBUTE: Final[str] = "orchard.packed"
"""Field attribute marking a ``bytes`` field as a packed array; its value is a key of ``PACKED_DTYPES``."""
CRC64_AVRO_EMPTY: Final[int] = 0xC15D213AA4D7A795
"""The CRC-64-AVRO (Rabin) fingerprint of the empty string, and the polynomial of its table."""

_VERSION_FILE = re.compile(r"v([1-9][0-9]*)\.avsc")


def _rabin_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        fp = byte
        for _ in range(8):
            fp = (fp >> 1) ^ (CRC64_AVRO_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_RABIN_TABLE: Final[tuple[int, ...]] = _rabin_table()


def rabin_fingerprint(data: bytes) -> int:
    """CRC-64-AVRO fingerprint of ``data`` as an unsigned 64-bit integer (written little-endian on the wire)."""
    fp = CRC64_AVRO_EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _RABIN_TABLE[(fp ^ byte) & 0xFF]
    return fp


@dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One released version of one record schema, parsed once."""

    name: str
    version: int
    path: Path
    schema: dict[str, Any] = field(repr=False)
    parsed: dict[str, Any] = field(repr=False)
    canonical_form: str = field(repr=False)
    fingerprint: int
    packed_fields: Mapping[str, str] = field(repr=False)

    @property
    def fingerprint_bytes(self) -> bytes:
        """The fingerprint as written in the header (8 bytes, little-endian)."""
        return self.fingerprint.to_bytes(8, "little")

    @property
    def fingerprint_hex(self) -> str:
        """The header's fingerprint bytes in hex, as ``fastavro.schema.fingerprint`` and Java print it."""
        return self.fingerprint_bytes.hex()

    @property
    def header(self) -> bytes:
        """The 10-byte single-object header of records written with this version."""
        return MARKER + self.fingerprint_bytes


class SchemaCatalog:
    """Every version of every record schema, indexed by name and by fingerprint."""

    def __init__(self, versions: Iterable[SchemaVersion], schema_dir: Path | None = None) -> None:
        """Index ``versions``; ``schema_dir`` is only used in messages."""
        self.schema_dir = schema_dir
        self._by_name: dict[str, dict[int, SchemaVersion]] = {}
        self._by_fingerprint: dict[int, SchemaVersion] = {}
        for sv in sorted(versions, key=lambda v: (v.name, v.version)):
            if sv.version in self._by_name.setdefault(sv.name, {}):
                raise SchemaCatalogError(f"{sv.name} v{sv.version} is defined twice")
            self._by_name[sv.name][sv.version] = sv
            self._by_fingerprint.setdefault(sv.fingerprint, sv)

    @classmethod
    def load(cls, schema_dir: Path = SCHEMA_DIR) -> SchemaCatalog:
        """Load and parse ``<schema_dir>/<Name>/v<N>.avsc`` for every name and version."""
        if not schema_dir.is_dir():
            raise SchemaCatalogError(f"schema directory {schema_dir} does not exist")
        return cls((sv for folder in sorted(schema_dir.iterdir()) for sv in _load_folder(folder)), schema_dir)

    def names(self) -> list[str]:
        """Record names, sorted."""
        return sorted(self._by_name)

    def versions(self, name: str) -> list[SchemaVersion]:
        """Every version of ``name``, oldest first."""
        return [self._versions_of(name)[v] for v in sorted(self._versions_of(name))]

    def current(self, name: str) -> SchemaVersion:
        """The highest version of ``name``: the schema this code writes and reads."""
        versions = self._versions_of(name)
        return versions[max(versions)]

    def get(self, name: str, version: int) -> SchemaVersion:
        """Version ``version`` of ``name``."""
        try:
            return self._versions_of(name)[version]
        except KeyError:
            raise UnknownSchemaError(f"{name} has no version {version} in the catalog") from None

    def by_fingerprint(self, fingerprint: int) -> SchemaVersion:
        """The (oldest) version whose canonical form has this fingerprint."""
        try:
            return self._by_fingerprint[fingerprint]
        except KeyError:
            raise unknown_fingerprint_error(fingerprint.to_bytes(8, "little"), self.schema_dir) from None

    def __iter__(self) -> Iterator[SchemaVersion]:
        """Every version of every name, by name then version."""
        return (sv for name in self.names() for sv in self.versions(name))

    def __contains__(self, name: object) -> bool:
        """Whether the catalog holds a schema called ``name``."""
        return name in self._by_name

    def _versions_of(self, name: str) -> dict[int, SchemaVersion]:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownSchemaError(f"no schema named {name!r} in the catalog{self._where()}") from None

    def _where(self) -> str:
        return f" at {self.schema_dir}" if self.schema_dir else ""


def unknown_fingerprint_error(fingerprint: bytes, schema_dir: Path | None) -> UnknownFingerprintError:
    """The error for a record whose header names a fingerprint the catalog at ``schema_dir`` does not hold."""
    where = f" at {schema_dir}" if schema_dir else ""
    return UnknownFingerprintError(
        f"writer schema fingerprint {fingerprint.hex()} is not in the schema catalog{where}; "
        "was the record written with a newer schema version, or is it not an Orchard record?"
    )


def _load_folder(folder: Path) -> list[SchemaVersion]:
    if folder.is_file() and folder.suffix == ".avsc":
        raise SchemaCatalogError(f"{folder}: schemas go in <Name>/v<N>.avsc, not at the top of the schema directory")
    if not folder.is_dir() or folder.name.startswith(("_", ".")):
        return []
    loaded = []
    for path in sorted(folder.glob("*.avsc")):
        match = _VERSION_FILE.fullmatch(path.name)
        if match is None:
            raise SchemaCatalogError(f"{path}: schema files must be named v<N>.avsc with N >= 1")
        loaded.append(load_schema_version(path, folder.name, int(match.group(1))))
    return loaded


def load_schema_version(path: Path, name: str, version: int) -> SchemaVersion:
    """Read, check and parse one ``.avsc`` file that must define record ``name``."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaCatalogError(f"{path}: cannot read schema: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise SchemaCatalogError(f"{path}: a catalog schema must be a JSON object of type record")
    if str(raw.get("name", "")).rsplit(".", 1)[-1] != name:
        raise SchemaCatalogError(f"{path}: defines record {raw.get('name')!r} but its folder is {name!r}")
    try:
        parsed = cast(dict[str, Any], fastavro.parse_schema(raw, named_schemas={}))
        canonical = to_parsing_canonical_form(raw)
    except Exception as exc:  # fastavro raises several types for an invalid schema
        raise SchemaCatalogError(f"{path}: invalid Avro schema: {exc}") from exc
    return SchemaVersion(
        name=name,
        version=version,
        path=path,
        schema=raw,
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=rabin_fingerprint(canonical.encode("utf-8")),
        packed_fields=_packed_fields(raw, path),
    )


def _packed_fields(raw: Mapping[str, Any], path: Path) -> dict[str, str]:
    packed = {}
    for fld in raw["fields"]:
        kind = fld.get(PACKED_ATTRIBUTE)
        if kind is None:
            continue
        if kind not in PACKED_DTYPES:
            raise SchemaCatalogError(f"{path}: field {fld['name']}: unknown {PACKED_ATTRIBUTE} kind {kind!r}")
        if fld["type"] not in ("bytes", ["null", "bytes"]):
            raise SchemaCatalogError(f"{path}: field {fld['name']}: {PACKED_ATTRIBUTE} needs type bytes")
        packed[fld["name"]] = kind
    return packed
