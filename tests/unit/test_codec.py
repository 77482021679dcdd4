"""Single-object encoding, the Rabin fingerprint, the schema catalog, decode errors and the JSON view."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pytest
from fastavro.schema import fingerprint as fastavro_fingerprint

from orchard.codec import Codec, DecodedRecord, to_json_dict
from orchard.schema_catalog import CRC64_AVRO_EMPTY, MARKER, SchemaCatalog, rabin_fingerprint
from orchard.serialization_errors import (
    CorruptRecordError,
    IncompatibleSchemaError,
    SchemaCatalogError,
    SchemaValidationError,
    SerializationError,
    UnknownFingerprintError,
    UnknownSchemaError,
)
from orchard.tokens import pack_logprobs, pack_token_ids
from schemas import SCHEMA_DIR

T0 = datetime(2026, 11, 29, 14, 3, 7, 250_000, tzinfo=UTC)

# Apache Avro's cross-language vectors (share/test/data/schema-tests.txt), published as signed 64-bit integers.
AVRO_RABIN_VECTORS = [
    ('"null"', 7195948357588979594),
    ('"boolean"', -6970731678124411036),
    ('"int"', 8247732601305521295),
    ('"long"', -3434872931120570953),
    ('"string"', -8142146995180207161),
    ('{"name":"foo","type":"fixed","size":15}', 1756455273707447556),
    (
        '{"name":"PigValue","type":"record","fields":[{"name":"value","type":["null","int","long","PigValue"]}]}',
        -1759257747318642341,
    ),
]


def model_call(**overrides: Any) -> dict[str, Any]:
    """A ModelCall with every field set."""
    record = {
        "run_id": "run-2026-11-29",
        "episode_id": "ep-000131",
        "task_id": "astropy__astropy-12907",
        "call_index": 4,
        "conversation_id": 0,
        "harness": "codex",
        "api_flavour": "RESPONSES",
        "harness_api": "RESPONSES",
        "model": "orchard-swe-3b",
        "policy_version": 17,
        "request_messages_json": json.dumps([{"role": "user", "content": "Fix the failing test."}]),
        "request_messages_prefix_count": 0,
        "request_tools_json": json.dumps([{"type": "function", "name": "shell"}]),
        "sampling_params_json": json.dumps({"temperature": 1.0, "max_tokens": 512}),
        "response_text": "",
        "response_tool_calls_json": json.dumps([{"name": "shell", "arguments": '{"cmd": "pytest -x"}'}]),
        "finish_reason": "tool_calls",
        "prompt_base_call_index": 3,
        "prompt_prefix_length": 4_021,
        "prompt_token_ids": pack_token_ids([151_644, 872, 198, 785]),
        "completion_token_ids": pack_token_ids([8_156, 13, 151_645]),
        "completion_logprobs": pack_logprobs([-0.25, -1.5, -0.0078125]),
        "retokenized": False,
        "canonicalized_messages": [],
        "latency_ms": 1_234.5,
        "timestamp": T0,
    }
    return record | overrides


def write_catalog(root: Path, schemas: dict[str, list[dict[str, Any]]]) -> SchemaCatalog:
    """Write ``{name: [v1, v2, ...]}`` as a catalog under ``root`` and load it."""
    for name, versions in schemas.items():
        (root / name).mkdir(parents=True)
        for number, schema in enumerate(versions, start=1):
            (root / name / f"v{number}.avsc").write_text(json.dumps(schema))
    return SchemaCatalog.load(root)


def shipped_schema(name: str) -> dict[str, Any]:
    """The current shipped schema of ``name`` as JSON."""
    return SchemaCatalog.load().current(name).schema


MODEL_CALL_VERSION = SchemaCatalog.load().current("ModelCall").version


def with_field(schema: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with ``field`` appended."""
    return schema | {"fields": [*schema["fields"], field]}


@pytest.mark.parametrize(("canonical", "signed"), AVRO_RABIN_VECTORS)
def test_rabin_fingerprint_matches_avro_vectors(canonical: str, signed: int) -> None:
    assert rabin_fingerprint(canonical.encode()) == signed & (2**64 - 1)


def test_rabin_fingerprint_of_nothing_is_the_empty_constant() -> None:
    assert rabin_fingerprint(b"") == CRC64_AVRO_EMPTY


def test_rabin_fingerprint_matches_fastavro() -> None:
    rng = np.random.default_rng(7)
    alphabet = list('abc{}[]":,é')
    texts = [sv.canonical_form for sv in Codec.default().catalog]
    texts += ["".join(rng.choice(alphabet, size=rng.integers(80))) for _ in range(50)]
    ours = [rabin_fingerprint(text.encode()).to_bytes(8, "little").hex() for text in texts]
    assert ours == [fastavro_fingerprint(text, "CRC-64-AVRO") for text in texts]


def test_header_is_marker_then_little_endian_fingerprint_then_avro_body() -> None:
    codec = Codec.default()
    sv = codec.schema("ModelCall")
    data = codec.encode("ModelCall", model_call())
    body = io.BytesIO()
    fastavro.schemaless_writer(body, sv.parsed, model_call())
    assert data == b"\xc3\x01" + rabin_fingerprint(sv.canonical_form.encode()).to_bytes(8, "little") + body.getvalue()
    assert sv.fingerprint_hex == fastavro_fingerprint(sv.canonical_form, "CRC-64-AVRO")
    assert data[:2] == MARKER


def test_decode_round_trips_the_whole_record() -> None:
    codec = Codec.default()
    decoded = codec.decode(codec.encode("ModelCall", model_call()))
    assert decoded == DecodedRecord("ModelCall", MODEL_CALL_VERSION, MODEL_CALL_VERSION, model_call())


def test_omitted_defaulted_fields_decode_as_their_defaults() -> None:
    codec = Codec.default()
    record = {k: v for k, v in model_call().items() if k not in {"request_tools_json", "retokenized"}}
    record |= {"prompt_base_call_index": None, "prompt_prefix_length": 0}
    assert codec.decode(codec.encode("ModelCall", record)).record == model_call(
        request_tools_json="[]", retokenized=False, prompt_base_call_index=None, prompt_prefix_length=0
    )


def test_packed_fields_accept_arrays_and_sequences() -> None:
    codec = Codec.default()
    arrays = model_call(
        prompt_token_ids=np.array([151_644, 872, 198, 785], dtype=np.int64),
        completion_token_ids=[8_156, 13, 151_645],
        completion_logprobs=np.array([-0.25, -1.5, -0.0078125]),
    )
    assert codec.encode("ModelCall", arrays) == codec.encode("ModelCall", model_call())


def test_int_millisecond_timestamps_are_accepted() -> None:
    codec = Codec.default()
    millis = int(T0.timestamp() * 1000)
    assert codec.encode("ModelCall", model_call(timestamp=millis)) == codec.encode("ModelCall", model_call())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"call_index": 1.5}, "ModelCall v3: call_index: expected int, got float 1.5"),
        ({"call_index": 2**31}, "ModelCall v3: call_index: expected int, got int 2147483648"),
        ({"retokenized": 1}, "ModelCall v3: retokenized: expected boolean, got int 1"),
        ({"policy_version": True}, "ModelCall v3: policy_version: expected long, got bool True"),
        (
            {"api_flavour": "COMPLETIONS"},
            "ModelCall v3: api_flavour: expected one of ['CHAT', 'RESPONSES'], got str 'COMPLETIONS'",
        ),
        ({"prompt_base_call_index": "3"}, "ModelCall v3: prompt_base_call_index: expected null or int, got str '3'"),
        (
            {"timestamp": "2026-11-29"},
            "ModelCall v3: timestamp: expected timezone-aware datetime or int (timestamp-millis), got str '2026-11-29'",
        ),
        (
            {"timestamp": datetime(2026, 11, 29)},
            "ModelCall v3: timestamp: expected timezone-aware datetime or int (timestamp-millis), got datetime "
            "datetime.datetime(2026, 11, 29, 0, 0)",
        ),
        ({"tokens": b""}, "ModelCall v3: unknown fields ['tokens']"),
        (
            {"completion_token_ids": b"\x00" * 6},
            "ModelCall v3: field completion_token_ids: 6 bytes is not a whole number of int32 values",
        ),
        (
            {"completion_token_ids": [0.5]},
            "ModelCall v3: field completion_token_ids: cannot pack values of dtype float64 as int32",
        ),
    ],
)
def test_encode_rejects_invalid_records(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaValidationError) as caught:
        Codec.default().encode("ModelCall", model_call(**overrides))
    assert str(caught.value) == message


def test_encode_reports_every_missing_required_field() -> None:
    record = {k: v for k, v in model_call().items() if k not in {"run_id", "latency_ms"}}
    with pytest.raises(SchemaValidationError) as caught:
        Codec.default().encode("ModelCall", record)
    assert str(caught.value) == (
        "ModelCall v3: run_id: missing (the field has no default); latency_ms: missing (the field has no default)"
    )


def test_encode_checks_complex_fields_with_fastavro() -> None:
    outcome = {
        "run_id": "r",
        "episode_id": "e",
        "task_id": "t",
        "group_id": "g",
        "status": "SUCCEEDED",
        "reward": 1.0,
        "success": True,
        "signals": {"tests_passed": "all"},
        "num_model_calls": 3,
        "started_at": T0,
        "ended_at": T0,
    }
    with pytest.raises(SchemaValidationError, match=r"EpisodeOutcome v2: .*signals"):
        Codec.default().encode("EpisodeOutcome", outcome)


def test_unknown_schema_name() -> None:
    with pytest.raises(UnknownSchemaError, match="no schema named 'ModelCalls'"):
        Codec.default().encode("ModelCalls", model_call())


def test_default_codec_is_built_once() -> None:
    assert Codec.default() is Codec.default()


def test_unknown_fingerprint_shows_the_fingerprint() -> None:
    data = Codec.default().encode("ModelCall", model_call())
    forged = data[:2] + bytes.fromhex("0123456789abcdef") + data[10:]
    with pytest.raises(UnknownFingerprintError) as caught:
        Codec.default().decode(forged)
    assert str(caught.value) == (
        f"writer schema fingerprint 0123456789abcdef is not in the schema catalog at {SCHEMA_DIR}; "
        "was the record written with a newer schema version, or is it not an Orchard record?"
    )


def test_bad_marker() -> None:
    data = Codec.default().encode("ModelCall", model_call())
    with pytest.raises(CorruptRecordError) as caught:
        Codec.default().decode(b"\xc3\x02" + data[2:])
    assert str(caught.value) == "bad single-object marker c302 (expected c301)"


def test_shorter_than_the_header() -> None:
    with pytest.raises(CorruptRecordError) as caught:
        Codec.default().decode(b"\xc3\x01\x00")
    assert str(caught.value) == "record of 3 bytes is shorter than the 10-byte header"


def test_truncated_body() -> None:
    data = Codec.default().encode("ModelCall", model_call())
    with pytest.raises(CorruptRecordError, match=r"^ModelCall v3 body is unreadable: ") as caught:
        Codec.default().decode(data[:-1])
    assert caught.value.__cause__ is not None


def test_trailing_bytes() -> None:
    data = Codec.default().encode("ModelCall", model_call())
    with pytest.raises(CorruptRecordError) as caught:
        Codec.default().decode(data + b"\x00\x00")
    assert str(caught.value) == "ModelCall v3 record has 2 trailing bytes"


def test_packed_field_of_bad_length_is_corrupt() -> None:
    sv = Codec.default().schema("ModelCall")
    body = io.BytesIO()
    fastavro.schemaless_writer(body, sv.parsed, model_call(completion_logprobs=b"\x00" * 5))
    with pytest.raises(CorruptRecordError) as caught:
        Codec.default().decode(sv.header + body.getvalue())
    assert str(caught.value) == "ModelCall.completion_logprobs: 5 bytes is not a whole number of float32 values"


def _mutations(data: bytes, rng: np.random.Generator) -> list[bytes]:
    truncations = [data[:n] for n in range(len(data))]
    flips = []
    for _ in range(400):
        corrupt = bytearray(data)
        for _ in range(rng.integers(1, 4)):
            corrupt[rng.integers(10, len(data))] = rng.integers(256)
        flips.append(bytes(corrupt))
    return truncations + flips


def test_every_decode_failure_is_a_serialization_error() -> None:
    codec, rng = Codec.default(), np.random.default_rng(11)
    data = codec.encode("ModelCall", model_call())
    failures: dict[str, int] = {}
    for mutated in _mutations(data, rng):
        try:
            codec.decode(mutated)
        except SerializationError as exc:
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
    assert set(failures) <= {"CorruptRecordError", "UnknownFingerprintError"}
    assert failures["CorruptRecordError"] >= len(data)  # every truncation at least


def test_to_json_dict_unpacks_packed_fields_from_the_schema() -> None:
    codec = Codec.default()
    view = to_json_dict(codec.decode(codec.encode("ModelCall", model_call())))
    assert view == model_call(
        prompt_token_ids=[151_644, 872, 198, 785],
        completion_token_ids=[8_156, 13, 151_645],
        completion_logprobs=[-0.25, -1.5, -0.0078125],
        timestamp="2026-11-29T14:03:07.250000+00:00",
    )
    assert json.loads(json.dumps(view)) == view


def test_to_json_dict_writes_other_bytes_in_base64() -> None:
    codec = Codec.default()
    letter = {
        "original": b"\xc3\x01garbage",
        "source_topic": "model-calls",
        "source_partition": 3,
        "source_offset": 1_048_576,
        "source_key": b"ep-000131",
        "reason": "bad single-object marker c302 (expected c301)",
        "error_type": "CorruptRecordError",
        "consumer_group": "trajectory-assembler",
        "timestamp": T0,
    }
    view = codec.to_json_dict(codec.decode(codec.encode("DeadLetter", letter)))
    assert view == letter | {
        "original": "wwFnYXJiYWdl",
        "source_key": "ZXAtMDAwMTMx",
        "timestamp": "2026-11-29T14:03:07.250000+00:00",
    }


# --- the catalog ---------------------------------------------------------------------------------------------


def test_shipped_catalog_has_every_record() -> None:
    catalog = SchemaCatalog.load()
    assert catalog.names() == [
        "DeadLetter",
        "EpisodeOutcome",
        "ModelCall",
        "PolicyVersion",
        "RolloutRound",
        "SandboxEvent",
        "StepScore",
        "TrainingSample",
        "Trajectory",
    ]
    assert [(sv.name, sv.version) for sv in catalog] == sorted(
        [(name, 1) for name in catalog.names()]
        + [("EpisodeOutcome", 2), ("ModelCall", 2), ("ModelCall", 3), ("StepScore", 2)]
    )
    assert catalog.by_fingerprint(catalog.current("ModelCall").fingerprint) is catalog.current("ModelCall")


def _one_field(field: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "X", "fields": [field]})


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"ModelCall/version1.avsc": "{}"}, "schema files must be named v<N>.avsc with N >= 1"),
        ({"Stray.avsc": "{}"}, "schemas go in <Name>/v<N>.avsc, not at the top of the schema directory"),
        ({"ModelCall/v1.avsc": "{nope"}, "cannot read schema"),
        ({"Other/v1.avsc": json.dumps(shipped_schema("StepScore"))}, "defines record 'StepScore' but its folder is"),
        ({"X/v1.avsc": _one_field({"name": "a", "type": "nope"})}, "invalid Avro schema"),
        (
            {"X/v1.avsc": _one_field({"name": "a", "type": "int", "orchard.packed": "int32"})},
            "field a: orchard.packed needs type bytes",
        ),
        (
            {"X/v1.avsc": _one_field({"name": "a", "type": "bytes", "orchard.packed": "int8"})},
            "field a: unknown orchard.packed kind 'int8'",
        ),
    ],
)
def test_malformed_catalogs_are_rejected(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    with pytest.raises(SchemaCatalogError, match=re.escape(message)):
        SchemaCatalog.load(tmp_path)


def test_unknown_versions_and_names() -> None:
    catalog = SchemaCatalog.load()
    with pytest.raises(UnknownSchemaError, match="ModelCall has no version 4"):
        catalog.get("ModelCall", 4)
    with pytest.raises(UnknownSchemaError, match="cannot pin unknown schema names"):
        Codec(catalog, versions={"Nope": 1})


# --- evolution details the codec handles itself ------------------------------------------------------------------


def _evolved_catalog(tmp_path: Path, *new_fields: dict[str, Any]) -> SchemaCatalog:
    v1 = shipped_schema("ModelCall")
    v2 = v1
    for field in new_fields:
        v2 = with_field(v2, field)
    return write_catalog(tmp_path, {"ModelCall": [v1, v2]})


def test_defaults_for_fields_the_writer_lacked_are_converted_like_decoded_values(tmp_path: Path) -> None:
    catalog = _evolved_catalog(
        tmp_path,
        {"name": "draft_token_ids", "type": "bytes", "default": "", "orchard.packed": "int32", "doc": "d"},
        {"name": "marker", "type": "bytes", "default": "\u00ff\u0001", "doc": "d"},
        {"name": "queued_at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1000, "doc": "d"},
        {"name": "tags", "type": {"type": "map", "values": "string"}, "default": {}, "doc": "d"},
    )
    old = Codec(catalog, versions={"ModelCall": 1}).encode("ModelCall", model_call())
    codec = Codec(catalog)
    first, second = codec.decode(old), codec.decode(old)
    assert first == DecodedRecord(
        "ModelCall",
        1,
        2,
        model_call(
            draft_token_ids=b"", marker=b"\xff\x01", queued_at=datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), tags={}
        ),
    )
    first.record["tags"]["mutated"] = "yes"
    assert second.record["tags"] == {}
    assert catalog.current("ModelCall").schema["fields"][-1]["default"] == {}
    assert codec.to_json_dict(first)["draft_token_ids"] == []


def test_an_incompatible_catalog_fails_at_read_time_as_incompatible(tmp_path: Path) -> None:
    v1 = shipped_schema("ModelCall")
    v2 = v1 | {"fields": [f | {"type": "long"} if f["name"] == "call_index" else f for f in v1["fields"]]}
    catalog = write_catalog(tmp_path, {"ModelCall": [v1, v2]})
    new_data = Codec(catalog).encode("ModelCall", model_call())
    with pytest.raises(IncompatibleSchemaError, match="^ModelCall v2 cannot be read as v1: "):
        Codec(catalog, versions={"ModelCall": 1}).decode(new_data)


def test_omitted_fields_with_bytes_and_timestamp_defaults_can_be_written(tmp_path: Path) -> None:
    catalog = _evolved_catalog(
        tmp_path,
        {"name": "draft_token_ids", "type": "bytes", "default": "", "orchard.packed": "int32", "doc": "d"},
        {"name": "queued_at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 1000, "doc": "d"},
    )
    codec = Codec(catalog)
    assert codec.decode(codec.encode("ModelCall", model_call())).record == model_call(
        draft_token_ids=b"", queued_at=datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    )


@pytest.mark.parametrize(
    ("calls", "ok"), [([b"a", bytearray(b"b")], True), ((b"a",), True), ([b"a", "b"], False), (b"ab", False)]
)
def test_array_fields_are_checked_as_fastavro_checks_them(calls: Any, ok: bool) -> None:
    record = {"run_id": "r", "episode_id": "e", "task_id": "t", "group_id": "", "policy_version": None,
              "complete": False, "incomplete_reason": None, "num_model_calls": None, "outcome": None, "calls": calls,
              "timestamp": 0}  # fmt: skip
    assert fastavro.validation.validate(record, Codec.default().schema("Trajectory").parsed, raise_errors=False) is ok
    if ok:
        assert Codec.default().decode(Codec.default().encode("Trajectory", record)).record["calls"] == list(calls)
    else:
        with pytest.raises(SchemaValidationError, match="calls: expected array"):
            Codec.default().encode("Trajectory", record)
