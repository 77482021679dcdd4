"""The shipped schemas: conventions, documentation, a round trip of each, and an evolution test of each."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchard.codec import Codec, DecodedRecord
from orchard.schema_catalog import SchemaCatalog
from orchard.schema_compat import check_catalog
from orchard.tokens import pack_logprobs, pack_loss_mask, pack_token_ids
from schemas import SCHEMA_DIR

T0 = datetime(2026, 11, 29, 9, 30, 0, 125_000, tzinfo=UTC)
RNG = np.random.default_rng(2026)
PROMPT = RNG.integers(0, 151_000, 4_096)
COMPLETION = RNG.integers(0, 151_000, 512)
LOGPROBS = -RNG.exponential(0.3, 512).astype(np.float32)

SAMPLES: dict[str, dict[str, Any]] = {
    "ModelCall": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "task_id": "sympy__sympy-20590",
        "call_index": 12,
        "conversation_id": 1,
        "harness": "codex",
        "api_flavour": "RESPONSES",
        "harness_api": "RESPONSES",
        "model": "orchard-swe-3b",
        "policy_version": 41,
        "request_messages_json": json.dumps([{"role": "user", "content": "The test test_printing fails."}]),
        "request_messages_prefix_count": 2,
        "request_tools_json": json.dumps([{"type": "function", "name": "shell", "parameters": {"type": "object"}}]),
        "sampling_params_json": json.dumps({"temperature": 1.0, "top_p": 1.0, "max_output_tokens": 512}),
        "response_text": "Let me run the failing test first.",
        "response_tool_calls_json": json.dumps([{"name": "shell", "arguments": '{"cmd": ["pytest", "-x"]}'}]),
        "finish_reason": "tool_calls",
        "prompt_base_call_index": 11,
        "prompt_prefix_length": 3_880,
        "prompt_token_ids": pack_token_ids(PROMPT),
        "completion_token_ids": pack_token_ids(COMPLETION),
        "completion_logprobs": pack_logprobs(LOGPROBS),
        "retokenized": False,
        "canonicalized_messages": [],
        "latency_ms": 2_417.25,
        "timestamp": T0,
    },
    "EpisodeOutcome": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "task_id": "sympy__sympy-20590",
        "group_id": "grp-sympy-20590-step-41",
        "status": "SUCCEEDED",
        "reward": 1.0,
        "success": True,
        "signals": {"tests_passed_fraction": 1.0, "patch_lines": 14.0},
        "num_model_calls": 23,
        "model_call_counts": {
            "received": 27,
            "recorded": 23,
            "pending": 0,
            "failed": 0,
            "dropped": 0,
            "abandoned": 1,
            "refused": 2,
            "backend_failed": 1,
            "in_flight": 0,
        },
        "artifact_uris": [
            "s3://orchard/runs/swe-rl/ep-7f3a91/patch.diff",
            "s3://orchard/runs/swe-rl/ep-7f3a91/log.txt",
        ],
        "policy_version": 41,
        "started_at": T0 - timedelta(minutes=7),
        "ended_at": T0,
        "error": None,
    },
    "Trajectory": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "task_id": "sympy__sympy-20590",
        "group_id": "grp-sympy-20590-step-41",
        "policy_version": 41,
        "complete": False,
        "incomplete_reason": "22 of 23 model calls arrived within 600s of the outcome",
        "num_model_calls": 23,
        "outcome": b"\xc3\x01encoded-EpisodeOutcome",
        "calls": [b"\xc3\x01encoded-ModelCall-0", b"\xc3\x01encoded-ModelCall-1"],
        "timestamp": T0,
    },
    "StepScore": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "call_index": 12,
        "scorer": "process-reward-model",
        "policy_version": 41,
        "token_start": 0,
        "token_end": 512,
        "score": 0.82,
        "details_json": json.dumps({"wrote_test": True, "verified_fix": False}),
        "episode_score_count": 23,
        "timestamp": T0,
    },
    "TrainingSample": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "task_id": "sympy__sympy-20590",
        "group_id": "grp-sympy-20590-step-41",
        "sample_id": "ep-7f3a91/calls-0-22",
        "kind": "RL",
        "policy_version": 41,
        "token_ids": pack_token_ids(np.concatenate([PROMPT, COMPLETION])),
        "loss_mask": pack_loss_mask(np.r_[np.zeros(4_096), np.ones(512)].astype(bool)),
        "advantages": pack_logprobs(np.r_[np.zeros(4_096), np.full(512, 0.75)]),
        "behaviour_logprobs": pack_logprobs(np.r_[np.zeros(4_096), LOGPROBS]),
        "reward": 1.0,
        "created_at": T0,
    },
    "PolicyVersion": {
        "run_id": "swe-rl-2026-11-29",
        "model": "policy",
        "version": 42,
        "uri": "s3://orchard/runs/swe-rl/weights/policy/v42/",
        "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "trainer_step": 420,
        "metrics": {"loss": 0.4125, "kl": 0.0031, "grad_norm": 0.87},
        "created_at": T0,
    },
    "RolloutRound": {
        "run_id": "swe-rl-2026-11-29",
        "round": 12,
        "episodes": 64,
        "group_ids": ["r000012-sympy__sympy-20590", "r000012-sympy__sympy-21612"],
        "policy_version": 41,
        "complete": True,
        "samples_topic": "samples",
        "samples_end_offsets": [5120, 4980],
        "created_at": T0,
    },
    "SandboxEvent": {
        "run_id": "swe-rl-2026-11-29",
        "episode_id": "ep-7f3a91",
        "sandbox_id": "orchard-ep-7f3a91",
        "sequence": 57,
        "operation": "EXEC",
        "command_or_path": "pytest -x sympy/printing/tests/test_str.py",
        "exit_code": 1,
        "duration_ms": 5_310.5,
        "output_sha256": "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae",
        "output_bytes": 18_234,
        "timestamp": T0,
    },
    "DeadLetter": {
        "original": b"\xc3\x01\x00\x01\x02\x03\x04\x05\x06\x07truncated",
        "source_topic": "model-calls",
        "source_partition": 5,
        "source_offset": 981_233,
        "source_key": b"ep-7f3a91",
        "reason": "writer schema fingerprint 0001020304050607 is not in the schema catalog",
        "error_type": "UnknownFingerprintError",
        "consumer_group": "trajectory-assembler",
        "timestamp": T0,
    },
}
NAMES = sorted(SAMPLES)
PROBE = {"name": "evolution_probe", "type": "string", "default": "probe-default", "doc": "A field added in v2."}


def schema_json(name: str) -> dict[str, Any]:
    """The current shipped schema of ``name``."""
    return SchemaCatalog.load().current(name).schema


def test_every_shipped_schema_has_a_sample() -> None:
    assert SchemaCatalog.load().names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_round_trip(name: str) -> None:
    codec = Codec.default()
    version = SchemaCatalog.load().current(name).version
    assert codec.decode(codec.encode(name, SAMPLES[name])) == DecodedRecord(name, version, version, SAMPLES[name])


def test_model_call_v1_records_read_as_v2_with_no_harness_api_and_v2_records_read_as_v1() -> None:
    v1, v2 = (Codec(SchemaCatalog.load(), versions={"ModelCall": version}) for version in (1, 2))
    sample = {key: value for key, value in SAMPLES["ModelCall"].items() if key != "canonicalized_messages"}
    old = without_api(sample)
    assert v2.decode(v1.encode("ModelCall", old)) == DecodedRecord("ModelCall", 1, 2, old | {"harness_api": None})
    messages = sample | {"api_flavour": "CHAT", "harness_api": "MESSAGES"}
    assert v1.decode(v2.encode("ModelCall", messages)) == DecodedRecord("ModelCall", 2, 1, without_api(messages))


def test_model_call_v2_records_read_as_v3_with_no_canonicalized_turns_and_v3_records_read_as_v2() -> None:
    v2, v3 = Codec(SchemaCatalog.load(), versions={"ModelCall": 2}), Codec.default()
    old = {key: value for key, value in SAMPLES["ModelCall"].items() if key != "canonicalized_messages"}
    assert v3.decode(v2.encode("ModelCall", old)) == DecodedRecord(
        "ModelCall", 2, 3, old | {"canonicalized_messages": []}
    )
    new = SAMPLES["ModelCall"] | {"canonicalized_messages": [1, 3]}
    assert v2.decode(v3.encode("ModelCall", new)) == DecodedRecord("ModelCall", 3, 2, old)


def test_step_score_v1_records_read_as_v2_with_no_count_and_v2_records_read_as_v1() -> None:
    v1, v2 = Codec(SchemaCatalog.load(), versions={"StepScore": 1}), Codec.default()
    old = {key: value for key, value in SAMPLES["StepScore"].items() if key != "episode_score_count"}
    unsaid = old | {"episode_score_count": None}
    assert v2.decode(v1.encode("StepScore", old)) == DecodedRecord("StepScore", 1, 2, unsaid)
    assert v1.decode(v2.encode("StepScore", SAMPLES["StepScore"])) == DecodedRecord("StepScore", 2, 1, old)


def test_episode_outcome_v1_records_read_as_v2_with_no_call_counts_and_v2_records_read_as_v1() -> None:
    v1, v2 = Codec(SchemaCatalog.load(), versions={"EpisodeOutcome": 1}), Codec.default()
    old = {key: value for key, value in SAMPLES["EpisodeOutcome"].items() if key != "model_call_counts"}
    unsaid = old | {"model_call_counts": None}
    assert v2.decode(v1.encode("EpisodeOutcome", old)) == DecodedRecord("EpisodeOutcome", 1, 2, unsaid)
    assert v1.decode(v2.encode("EpisodeOutcome", SAMPLES["EpisodeOutcome"])) == DecodedRecord(
        "EpisodeOutcome", 2, 1, old
    )
    assert v2.decode(v2.encode("EpisodeOutcome", old)).record == unsaid  # a writer that knows no counts


def test_episode_outcome_call_counts_add_up_to_the_calls_received() -> None:
    counts = SAMPLES["EpisodeOutcome"]["model_call_counts"]
    fields = next(f for f in schema_json("EpisodeOutcome")["fields"] if f["name"] == "model_call_counts")
    names = [f["name"] for f in fields["type"][1]["fields"]]
    assert names == ["received", "recorded", "pending", "failed", "dropped", "abandoned", "refused", "backend_failed",
                     "in_flight"]  # fmt: skip
    assert counts["received"] == sum(counts[name] for name in names[1:])
    assert counts["recorded"] == SAMPLES["EpisodeOutcome"]["num_model_calls"]


def without_api(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key != "harness_api"}


@pytest.mark.parametrize("name", NAMES)
def test_schema_conventions(name: str) -> None:
    schema = schema_json(name)
    assert (schema["namespace"], schema["name"], schema["type"]) == ("dev.orchard", name, "record")
    undocumented = [f["name"] for f in schema["fields"] if not f.get("doc", "").strip()]
    assert (bool(schema.get("doc", "").strip()), undocumented) == (True, [])
    times = {f["name"]: f["type"] for f in schema["fields"] if f["name"] == "timestamp" or f["name"].endswith("_at")}
    assert set(map(json.dumps, times.values())) == {json.dumps({"type": "long", "logicalType": "timestamp-millis"})}
    enums = [f["type"] for f in schema["fields"] if isinstance(f["type"], dict) and f["type"]["type"] == "enum"]
    assert [bool(e.get("doc")) for e in enums] == [True] * len(enums)


@pytest.mark.parametrize("name", NAMES)
def test_identity_fields(name: str) -> None:
    fields = {f["name"] for f in schema_json(name)["fields"]}
    expected = {"run_id"} if name not in {"DeadLetter"} else {"source_topic", "source_partition", "source_offset"}
    expected |= {"episode_id"} if name not in {"DeadLetter", "PolicyVersion", "RolloutRound"} else set()
    assert expected <= fields


def test_packed_fields() -> None:
    catalog = SchemaCatalog.load()
    assert {
        name: dict(catalog.current(name).packed_fields) for name in NAMES if catalog.current(name).packed_fields
    } == {
        "ModelCall": {"prompt_token_ids": "int32", "completion_token_ids": "int32", "completion_logprobs": "float32"},
        "TrainingSample": {
            "token_ids": "int32",
            "loss_mask": "uint8",
            "advantages": "float32",
            "behaviour_logprobs": "float32",
        },
    }


def test_readme_documents_every_field_of_every_record() -> None:
    readme = (SCHEMA_DIR / "README.md").read_text()
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", readme, flags=re.S | re.M))
    documented = {name: re.findall(r"^\| `(\w+)` \|", sections.get(name, ""), flags=re.M) for name in NAMES}
    assert documented == {name: [f["name"] for f in schema_json(name)["fields"]] for name in NAMES}


def test_schema_files_are_package_data() -> None:
    """pyproject ships ``schemas/*.avsc`` and ``schemas/*/*.avsc``: every schema file must sit one folder down."""
    files = sorted(SCHEMA_DIR.rglob("*.avsc"))
    assert [len(path.relative_to(SCHEMA_DIR).parts) for path in files] == [2] * len(files)
    assert sorted({path.parent.name for path in files}) == NAMES


def test_shipped_catalog_passes_the_check() -> None:
    assert check_catalog(SchemaCatalog.load()) == []


def evolved_catalog(root: Path, name: str) -> SchemaCatalog:
    """A catalog with the shipped v1 of ``name`` and a v2 adding a defaulted field."""
    v1 = schema_json(name)
    (root / name).mkdir()
    (root / name / "v1.avsc").write_text(json.dumps(v1))
    (root / name / "v2.avsc").write_text(json.dumps(v1 | {"fields": [*v1["fields"], PROBE]}))
    return SchemaCatalog.load(root)


@pytest.mark.parametrize("name", NAMES)
def test_evolution(tmp_path: Path, name: str) -> None:
    catalog = evolved_catalog(tmp_path, name)
    old_process, new_process = Codec(catalog, versions={name: 1}), Codec(catalog)
    assert check_catalog(catalog) == []
    old_data = old_process.encode(name, SAMPLES[name])
    new_data = new_process.encode(name, SAMPLES[name] | {"evolution_probe": "set by v2"})
    assert old_data[2:10] != new_data[2:10]
    assert new_process.decode(old_data) == DecodedRecord(
        name, 1, 2, SAMPLES[name] | {"evolution_probe": "probe-default"}
    )
    assert old_process.decode(new_data) == DecodedRecord(name, 2, 1, SAMPLES[name])
    assert new_process.decode(new_data) == DecodedRecord(name, 2, 2, SAMPLES[name] | {"evolution_probe": "set by v2"})
