"""Avro schema resolution rules and the catalog check (backward and forward between consecutive versions)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from orchard.schema_catalog import SchemaCatalog
from orchard.schema_compat import (
    check_catalog,
    check_compatibility,
    check_defaults,
    run_schema_check,
    schema_check_problems,
)
from schemas import SCHEMA_DIR


def record(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A record schema in namespace dev.orchard."""
    return {"type": "record", "name": name, "namespace": "dev.orchard", "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    """A record field."""
    return {"name": name, "type": type_, **extra}


def enum(name: str, *symbols: str, **extra: Any) -> dict[str, Any]:
    """An enum schema."""
    return {"type": "enum", "name": name, "symbols": list(symbols), **extra}


def shipped(name: str) -> dict[str, Any]:
    """The shipped v1 of ``name``."""
    return json.loads((SCHEMA_DIR / name / "v1.avsc").read_text())


def catalog_with(tmp_path: Path, name: str, *versions: dict[str, Any]) -> SchemaCatalog:
    """A catalog holding ``versions`` of ``name`` as v1, v2, ..."""
    (tmp_path / name).mkdir()
    for number, schema in enumerate(versions, start=1):
        (tmp_path / name / f"v{number}.avsc").write_text(json.dumps(schema))
    return SchemaCatalog.load(tmp_path)


def replace_field(schema: dict[str, Any], name: str, **changes: Any) -> dict[str, Any]:
    """``schema`` with field ``name`` updated by ``changes``."""
    return schema | {"fields": [f | changes if f["name"] == name else f for f in schema["fields"]]}


# --- the catalog --------------------------------------------------------------------------------------------


def test_shipped_catalog_is_compatible() -> None:
    assert check_catalog(SchemaCatalog.load()) == []


def test_a_field_added_with_a_default_is_compatible_both_ways(tmp_path: Path) -> None:
    v1 = shipped("ModelCall")
    v2 = v1 | {"fields": [*v1["fields"], field("engine", "string", default="local", doc="Inference engine.")]}
    assert check_catalog(catalog_with(tmp_path, "ModelCall", v1, v2)) == []


def test_a_field_added_without_a_default_fails_backward(tmp_path: Path) -> None:
    v1 = shipped("ModelCall")
    v2 = v1 | {"fields": [*v1["fields"], field("engine", "string", doc="Inference engine.")]}
    assert check_catalog(catalog_with(tmp_path, "ModelCall", v1, v2)) == [
        "ModelCall v1->v2 backward (v2 reads v1 data): ModelCall.engine: "
        "reader field is missing from the writer and has no default"
    ]


def test_a_removed_field_without_a_default_fails_forward(tmp_path: Path) -> None:
    v1 = shipped("StepScore")
    v2 = v1 | {"fields": [f for f in v1["fields"] if f["name"] != "scorer"]}
    assert check_catalog(catalog_with(tmp_path, "StepScore", v1, v2)) == [
        "StepScore v1->v2 forward (v1 reads v2 data): StepScore.scorer: "
        "reader field is missing from the writer and has no default"
    ]


def test_a_removed_enum_symbol_fails(tmp_path: Path) -> None:
    v1 = shipped("EpisodeOutcome")
    status = enum("EpisodeStatus", "SUCCEEDED", "FAILED", "TIMED_OUT", "CRASHED")
    v2 = replace_field(v1, "status", type=status)
    assert check_catalog(catalog_with(tmp_path, "EpisodeOutcome", v1, v2)) == [
        "EpisodeOutcome v1->v2 backward (v2 reads v1 data): EpisodeOutcome.status: "
        "enum EpisodeStatus lacks writer symbols ['CANCELLED'] and has no default"
    ]


def test_an_added_enum_symbol_needs_a_default_in_the_old_reader(tmp_path: Path) -> None:
    v1 = shipped("ModelCall")
    v2 = replace_field(v1, "api_flavour", type=enum("ApiFlavour", "CHAT", "RESPONSES", "COMPLETIONS"))
    assert check_catalog(catalog_with(tmp_path, "ModelCall", v1, v2)) == [
        "ModelCall v1->v2 forward (v1 reads v2 data): ModelCall.api_flavour: "
        "enum ApiFlavour lacks writer symbols ['COMPLETIONS'] and has no default"
    ]


def test_int_to_long_passes_backward_but_fails_forward(tmp_path: Path) -> None:
    v1 = shipped("ModelCall")
    v2 = replace_field(v1, "call_index", type="long")
    assert check_catalog(catalog_with(tmp_path, "ModelCall", v1, v2)) == [
        "ModelCall v1->v2 forward (v1 reads v2 data): ModelCall.call_index: writer type long cannot be read as int"
    ]


def test_versions_must_be_numbered_without_gaps(tmp_path: Path) -> None:
    (tmp_path / "StepScore").mkdir()
    (tmp_path / "StepScore" / "v2.avsc").write_text(json.dumps(shipped("StepScore")))
    assert check_catalog(SchemaCatalog.load(tmp_path)) == ["StepScore: versions [2] are not numbered 1..1 without gaps"]


def test_invalid_union_defaults_are_reported(tmp_path: Path) -> None:
    v1 = replace_field(shipped("StepScore"), "token_start", default=0)
    assert check_catalog(catalog_with(tmp_path, "StepScore", v1)) == [
        "StepScore v1: StepScore.token_start: default 0 is not a valid [null, int]"
    ]


def test_run_schema_check_prints_and_returns_the_exit_code(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_schema_check(SCHEMA_DIR, Console(file=out, width=200)) == 0
    assert out.getvalue() == "ok 9 schemas, 13 versions, all compatible\n"
    v1 = shipped("ModelCall")
    catalog_with(tmp_path, "ModelCall", v1, replace_field(v1, "call_index", type="long"))
    out = io.StringIO()
    assert run_schema_check(tmp_path, Console(file=out, width=400)) == 1
    assert out.getvalue() == (
        "error ModelCall v1->v2 forward (v1 reads v2 data): ModelCall.call_index: writer type long cannot be read as "
        f"int\n1 schema problem(s) in {tmp_path}\n"
    )


def test_a_catalog_that_cannot_load_is_one_problem(tmp_path: Path) -> None:
    (tmp_path / "Broken").mkdir()
    (tmp_path / "Broken" / "v1.avsc").write_text("[")
    [problem] = schema_check_problems(tmp_path)
    assert problem.startswith(f"{tmp_path / 'Broken' / 'v1.avsc'}: cannot read schema: ")


# --- resolution rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    ],
)
def test_promotions_are_one_way(writer: str, reader: str) -> None:
    assert check_compatibility(record("R", field("x", reader)), record("R", field("x", writer))) == []
    assert check_compatibility(record("R", field("x", writer)), record("R", field("x", reader))) == (
        [] if {writer, reader} == {"string", "bytes"} else [f"R.x: writer type {reader} cannot be read as {writer}"]
    )


def test_writer_only_fields_are_skipped_and_reader_fields_need_defaults() -> None:
    writer = record("R", field("a", "int"), field("gone", "string"))
    reader = record("R", field("a", "int"), field("b", "string", default=""), field("c", "int"))
    assert check_compatibility(reader, writer) == ["R.c: reader field is missing from the writer and has no default"]


def test_a_renamed_field_resolves_through_reader_aliases() -> None:
    writer = record("R", field("prompt_ids", "bytes"))
    reader = record("R", field("prompt_token_ids", "bytes", aliases=["prompt_ids"]))
    assert check_compatibility(reader, writer) == []


def test_record_names_must_match_unless_a_reader_alias_names_the_writer() -> None:
    writer = record("OldCall", field("a", "int"))
    assert check_compatibility(record("NewCall", field("a", "int")), writer) == [
        "NewCall: writer record dev.orchard.OldCall does not match reader record dev.orchard.NewCall "
        "(names differ and no reader alias names it)"
    ]
    assert check_compatibility(record("NewCall", field("a", "int"), aliases=["OldCall"]), writer) == []


def test_enum_default_absorbs_unknown_symbols() -> None:
    writer = record("R", field("e", enum("E", "A", "B", "C")))
    assert check_compatibility(record("R", field("e", enum("E", "A", "B", default="A"))), writer) == []
    assert check_compatibility(record("R", field("e", enum("E", "A", "B"))), writer) == [
        "R.e: enum E lacks writer symbols ['C'] and has no default"
    ]


def test_fixed_needs_the_same_size() -> None:
    writer = record("R", field("h", {"type": "fixed", "name": "Hash", "size": 32}))
    reader = record("R", field("h", {"type": "fixed", "name": "Hash", "size": 16}))
    assert check_compatibility(reader, writer) == ["R.h: fixed Hash size 32 is read as 16"]


def test_arrays_and_maps_are_checked_recursively() -> None:
    writer = record("R", field("xs", {"type": "array", "items": "long"}), field("m", {"type": "map", "values": "int"}))
    reader = record("R", field("xs", {"type": "array", "items": "int"}), field("m", {"type": "map", "values": "long"}))
    assert check_compatibility(reader, writer) == ["R.xs.items: writer type long cannot be read as int"]
    assert check_compatibility(writer, reader) == ["R.m.values: writer type long cannot be read as int"]


def test_a_type_change_is_reported_with_both_types() -> None:
    writer = record("R", field("x", {"type": "array", "items": "int"}))
    reader = record("R", field("x", {"type": "map", "values": "int"}))
    assert check_compatibility(reader, writer) == ["R.x: writer type array<int> cannot be read as map<int>"]


def test_unions() -> None:
    optional_int = record("R", field("x", ["null", "int"], default=None))
    plain_int = record("R", field("x", "int"))
    optional_long = record("R", field("x", ["null", "long"], default=None))
    assert check_compatibility(optional_int, plain_int) == []  # a non-union writer matches a reader branch
    assert check_compatibility(optional_long, optional_int) == []  # each writer branch readable (promotion)
    assert check_compatibility(plain_int, optional_int) == ["R.x: writer type null cannot be read as int"]
    assert check_compatibility(record("R", field("x", ["null", "string"], default=None)), plain_int) == [
        "R.x: writer type int matches no branch of reader [null, string]"
    ]


def test_union_branches_of_named_types_match_by_name() -> None:
    a, b = record("A", field("v", "int")), record("B", field("v", "string"))
    writer = record("R", field("x", [a, b]))
    assert check_compatibility(record("R", field("x", [b, a])), writer) == []
    assert check_compatibility(record("R", field("x", [a])), writer) == [
        "R.x: writer type record B matches no branch of reader [record A]"
    ]


def test_recursive_types_terminate() -> None:
    node = record("Node", field("value", "int"), field("next", ["null", "dev.orchard.Node"], default=None))
    wider = record("Node", field("value", "long"), field("next", ["null", "dev.orchard.Node"], default=None))
    assert check_compatibility(wider, node) == []
    assert check_compatibility(node, wider) == ["Node.value: writer type long cannot be read as int"]


def test_a_changed_logical_type_is_reported() -> None:
    millis = record("R", field("t", {"type": "long", "logicalType": "timestamp-millis"}))
    micros = record("R", field("t", {"type": "long", "logicalType": "timestamp-micros"}))
    plain = record("R", field("t", "long"))
    assert check_compatibility(micros, millis) == ["R.t: logical type timestamp-millis is read as timestamp-micros"]
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
    wider = decimal | {"precision": 12}
    assert check_compatibility(record("R", field("d", wider)), record("R", field("d", decimal))) == [
        "R.d: logical type decimal(10,2) is read as decimal(12,2)"
    ]
    assert check_compatibility(millis, plain) == []


def test_an_invalid_schema_is_one_problem() -> None:
    [problem] = check_compatibility(record("R", field("x", "nope")), record("R", field("x", "int")))
    assert problem.startswith("invalid schema: ")


@pytest.mark.parametrize(
    ("type_", "default", "valid"),
    [
        ("int", 3, True),
        ("int", 2**31, False),
        ("int", True, False),
        ("double", 1, True),
        ("bytes", "\u00ff", True),
        ("bytes", "\u0100", False),
        (["null", "int"], None, True),
        (["null", "int"], 3, False),
        ({"type": "map", "values": "double"}, {"a": 1.0}, True),
        ({"type": "array", "items": "string"}, [1], False),
        (enum("E", "A", "B"), "C", False),
        ({"type": "fixed", "name": "F", "size": 2}, "ab", True),
        (record("Inner", field("a", "int"), field("b", "int", default=0)), {"a": 1}, True),
        (record("Inner", field("a", "int")), {}, False),
    ],
)
def test_check_defaults(type_: Any, default: Any, valid: bool) -> None:
    problems = check_defaults(record("R", field("x", type_, default=default)))
    assert (problems == []) is valid, problems
