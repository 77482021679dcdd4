"""Schema compatibility per the Avro specification's schema resolution rules, and the catalog check built on it.

``check_compatibility(reader, writer)`` lists why data written with ``writer`` could not be read with ``reader``:

- records: every reader field is found in the writer (by name, or by one of the reader field's aliases) or has a
  default; writer-only fields are skipped; record names match (unqualified, or through the reader's aliases);
- promotions: int to long/float/double, long to float/double, float to double, string to bytes and back;
- enums: every writer symbol is a reader symbol, unless the reader enum has a default;
- fixed: same name and size; arrays and maps: items and values recursively;
- unions: every writer branch is readable by the first matching reader branch (an exact type, then a promotion); a
  non-union writer must match a reader branch; a union writer read by a non-union reader needs every branch readable.

One check the specification leaves out: two different logical types on the same primitive (``timestamp-millis``
becoming ``timestamp-micros``) are reported, since the bits would be read with a different meaning.

``check_catalog`` requires each consecutive pair of versions of a name to be both backward compatible (the new
version reads old data) and forward compatible (the old version reads new data), versions numbered 1..N, and every
default valid for its field (a union's default matches its first branch).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import fastavro
from rich.console import Console
from rich.markup import escape

from orchard.schema_catalog import SchemaCatalog
from orchard.serialization_errors import SerializationError
from schemas import SCHEMA_DIR

Schema = str | list[Any] | dict[str, Any]
"""An Avro schema as JSON (a type name, a union list, or an object), raw or parsed by fastavro."""

_PROMOTIONS: Final = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)
_NAMED: Final = frozenset({"record", "error", "enum", "fixed"})
_INT_RANGES: Final = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def check_compatibility(reader_schema: Schema, writer_schema: Schema) -> list[str]:
    """Problems that stop ``reader_schema`` from reading data written with ``writer_schema``; empty if none."""
    try:
        reader_names: dict[str, Any] = {}
        writer_names: dict[str, Any] = {}
        reader = fastavro.parse_schema(reader_schema, named_schemas=reader_names, _write_hint=False)
        writer = fastavro.parse_schema(writer_schema, named_schemas=writer_names, _write_hint=False)
    except Exception as exc:  # fastavro raises several types for an invalid schema
        return [f"invalid schema: {exc}"]
    checker = _Resolver(reader_names, writer_names)
    checker.check(reader, writer, _short(_name_of(reader) or _describe(reader)))
    return checker.problems


def check_defaults(schema: Schema) -> list[str]:
    """Fields whose default does not match their type (for a union, its first branch); empty if none."""
    try:
        named: dict[str, Any] = {}
        parsed = fastavro.parse_schema(schema, named_schemas=named, _write_hint=False, _ignore_default_error=True)
    except Exception as exc:  # fastavro raises several types for an invalid schema
        return [f"invalid schema: {exc}"]
    problems: list[str] = []
    for record in [s for s in named.values() if s["type"] in ("record", "error")] or [parsed]:
        for fld in record.get("fields", []):
            if "default" in fld and not _default_ok(fld["type"], fld["default"], named):
                path = f"{_short(record['name'])}.{fld['name']}"
                problems.append(f"{path}: default {fld['default']!r} is not a valid {_describe(fld['type'])}")
    return problems


def check_catalog(catalog: SchemaCatalog) -> list[str]:
    """Every problem of the catalog: version numbering, invalid defaults, and consecutive versions that are not both
    backward and forward compatible."""
    problems: list[str] = []
    for name in catalog.names():
        versions = catalog.versions(name)
        numbers = [sv.version for sv in versions]
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{name}: versions {numbers} are not numbered 1..{len(numbers)} without gaps")
        for sv in versions:
            problems.extend(f"{name} v{sv.version}: {p}" for p in check_defaults(sv.schema))
        for old, new in itertools.pairwise(versions):
            pair = f"{name} v{old.version}->v{new.version}"
            problems.extend(
                f"{pair} backward (v{new.version} reads v{old.version} data): {p}"
                for p in check_compatibility(new.schema, old.schema)
            )
            problems.extend(
                f"{pair} forward (v{old.version} reads v{new.version} data): {p}"
                for p in check_compatibility(old.schema, new.schema)
            )
    return problems


def schema_check_problems(schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """Load the catalog at ``schema_dir`` and check it; a catalog that cannot load is one problem."""
    try:
        catalog = SchemaCatalog.load(schema_dir)
    except SerializationError as exc:
        return [str(exc)]
    return check_catalog(catalog)


def run_schema_check(schema_dir: Path = SCHEMA_DIR, console: Console | None = None) -> int:
    """``orchard schemas check``: print every problem of the catalog and return the exit code (0 when none)."""
    console = console if console is not None else Console(stderr=True)
    problems = schema_check_problems(schema_dir)
    for problem in problems:
        console.print(f"[red]error[/red] {escape(problem)}")
    if problems:
        console.print(f"{len(problems)} schema problem(s) in {escape(str(schema_dir))}")
        return 1
    catalog = SchemaCatalog.load(schema_dir)
    count = sum(1 for _ in catalog)
    console.print(f"[green]ok[/green] {len(catalog.names())} schemas, {count} versions, all compatible")
    return 0


class _Resolver:
    """Walks a reader and a writer schema together, collecting resolution problems with their paths."""

    def __init__(self, reader_names: Mapping[str, Any], writer_names: Mapping[str, Any]) -> None:
        """Resolve named-type references through each side's names."""
        self._reader_names = reader_names
        self._writer_names = writer_names
        self._seen: set[tuple[str, str]] = set()
        self.problems: list[str] = []

    def check(self, reader: Any, writer: Any, path: str) -> None:
        """Check that ``reader`` can read data written with ``writer`` at ``path``."""
        reader = _resolve(reader, self._reader_names)
        writer = _resolve(writer, self._writer_names)
        if isinstance(writer, list):
            for branch in writer:
                self.check(reader, branch, path)
        elif isinstance(reader, list):
            match = _matching_branch(reader, writer, self._reader_names)
            if match is None:
                self._problem(path, f"writer type {_describe(writer)} matches no branch of reader {_describe(reader)}")
            else:
                self.check(match, writer, path)
        elif _kind(reader) == _kind(writer) or {_kind(reader), _kind(writer)} <= {"record", "error"}:
            self._check_same_kind(reader, writer, path)
        elif (_kind(writer), _kind(reader)) not in _PROMOTIONS:
            self._problem(path, f"writer type {_describe(writer)} cannot be read as {_describe(reader)}")

    def _check_same_kind(self, reader: Any, writer: Any, path: str) -> None:
        kind = _kind(reader)
        if kind in _NAMED and not _names_match(reader, writer):
            self._problem(
                path,
                f"writer {kind} {writer['name']} does not match reader {kind} {reader['name']} "
                "(names differ and no reader alias names it)",
            )
        elif kind in ("record", "error"):
            self._check_record(reader, writer, path)
        elif kind == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                self._problem(path, f"enum {_short(reader['name'])} lacks writer symbols {missing} and has no default")
        elif kind == "fixed" and reader["size"] != writer["size"]:
            self._problem(path, f"fixed {_short(reader['name'])} size {writer['size']} is read as {reader['size']}")
        elif kind == "array":
            self.check(reader["items"], writer["items"], f"{path}.items")
        elif kind == "map":
            self.check(reader["values"], writer["values"], f"{path}.values")
        else:
            self._check_logical(reader, writer, path)

    def _check_record(self, reader: Mapping[str, Any], writer: Mapping[str, Any], path: str) -> None:
        key = (reader["name"], writer["name"])
        if key in self._seen:  # a recursive type already being checked
            return
        self._seen.add(key)
        writer_fields = {fld["name"]: fld for fld in writer["fields"]}
        for fld in reader["fields"]:
            names = [fld["name"], *fld.get("aliases", [])]
            source = next((writer_fields[n] for n in names if n in writer_fields), None)
            if source is not None:
                self.check(fld["type"], source["type"], f"{path}.{fld['name']}")
            elif "default" not in fld:
                self._problem(f"{path}.{fld['name']}", "reader field is missing from the writer and has no default")

    def _check_logical(self, reader: Any, writer: Any, path: str) -> None:
        reader_logical, writer_logical = _logical(reader), _logical(writer)
        if reader_logical and writer_logical and reader_logical != writer_logical:
            self._problem(path, f"logical type {writer_logical} is read as {reader_logical}")

    def _problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")


def _resolve(schema: Any, names: Mapping[str, Any]) -> Any:
    return names.get(schema, schema) if isinstance(schema, str) else schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    return schema if isinstance(schema, str) else str(schema["type"])


def _logical(schema: Any) -> str | None:
    """``timestamp-millis``, or ``decimal(precision,scale)``; None without a logical type."""
    if not isinstance(schema, dict) or "logicalType" not in schema:
        return None
    if schema["logicalType"] == "decimal":
        return f"decimal({schema.get('precision')},{schema.get('scale', 0)})"
    return str(schema["logicalType"])


def _name_of(schema: Any) -> str | None:
    return schema.get("name") if isinstance(schema, dict) and _kind(schema) in _NAMED else None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _names_match(reader: Mapping[str, Any], writer: Mapping[str, Any]) -> bool:
    """Unqualified names equal (as fastavro and the specification resolve), or a reader alias naming the writer."""
    namespace = reader["name"].rpartition(".")[0]
    aliases = {a if "." in a or not namespace else f"{namespace}.{a}" for a in reader.get("aliases", [])}
    candidates = {reader["name"], *aliases}
    return writer["name"] in candidates or _short(writer["name"]) in {_short(c) for c in candidates}


def _matching_branch(branches: list[Any], writer: Any, names: Mapping[str, Any]) -> Any | None:
    """The reader branch that reads ``writer``: the first of the same type (and name), else the first promotion."""
    resolved = [_resolve(b, names) for b in branches]
    writer_kind = _kind(writer)
    for branch in resolved:
        if _kind(branch) == writer_kind and (writer_kind not in _NAMED or _names_match(branch, writer)):
            return branch
    return next((b for b in resolved if (writer_kind, _kind(b)) in _PROMOTIONS), None)


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return "[" + ", ".join(_describe(b) for b in schema) + "]"
    if isinstance(schema, str):
        return _short(schema)
    kind = _kind(schema)
    if kind in _NAMED:
        return f"{kind} {_short(schema['name'])}"
    if kind == "array":
        return f"array<{_describe(schema['items'])}>"
    if kind == "map":
        return f"map<{_describe(schema['values'])}>"
    return f"{kind} ({schema['logicalType']})" if "logicalType" in schema else kind


def _default_ok(schema: Any, value: Any, names: Mapping[str, Any]) -> bool:
    """Whether ``value`` (a JSON default) is valid for ``schema``, per the specification's default rules."""
    schema = _resolve(schema, names)
    kind = _kind(schema)
    if kind == "union":
        return bool(schema) and _default_ok(schema[0], value, names)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
    if kind in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in ("string", "bytes", "fixed", "enum"):
        return isinstance(value, str) and _string_default_ok(schema, kind, value)
    if kind == "array":
        return isinstance(value, list) and all(_default_ok(schema["items"], v, names) for v in value)
    if kind == "map":
        return isinstance(value, dict) and all(_default_ok(schema["values"], v, names) for v in value.values())
    if kind in ("record", "error"):
        return isinstance(value, dict) and all(
            _default_ok(f["type"], value[f["name"]], names) if f["name"] in value else "default" in f
            for f in schema["fields"]
        )
    return False


def _string_default_ok(schema: Any, kind: str, value: str) -> bool:
    if kind == "enum":
        return value in schema["symbols"]
    if kind in ("bytes", "fixed") and any(ord(c) > 0xFF for c in value):
        return False  # bytes defaults are strings of code points 0-255
    return kind != "fixed" or len(value) == schema["size"]
