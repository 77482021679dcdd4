"""The imported-SFT recipe end to end: a synthetic dataset in the Orchard ``swe`` layout goes through ``orchard run``.

Its ``import`` stage runs ``orchard import`` (rows -> model calls + outcomes, a malformed row -> dead letter) with the
assembler and the SFT sample builder; its ``sft`` stage runs the policy trainer on the samples until it publishes a
policy version. The recipe file is run as shipped, on the embedded defaults, with the dataset in the run directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import Bus, TopicPartition, open_bus
from orchard.codec import Codec
from orchard.config import load_config
from orchard.topics import DEAD_LETTERS, MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES
from recipes.imported_sft.sample_data import is_successful, write_sample_dataset
from tests.integration.shrunk_recipes import run_to_completion

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "imported_sft" / "recipe.yaml"
RUN_ID = "imported-sft"  # the recipe's
ROWS = 32  # the recipe's import stage waits for the samples of these rows' 16 successful ones


def read_topic(bus: Bus, topic: str, deadline_s: float = 30.0) -> list[tuple[str, dict[str, Any]]]:
    """Every record of ``topic`` as (schema name, record), read to the topic's current end (the run's own bus)."""
    codec, out = Codec.default(), []
    info = bus.describe_topic(topic)
    ends = {TopicPartition(topic, p): end for p, end in info.end_offsets.items() if end > info.start_offsets.get(p, 0)}
    reader = bus.consumer([topic], group=None, start="earliest")
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            for record in reader.poll(max_records=500, timeout_s=0.5):
                decoded = codec.decode(record.value)
                out.append((decoded.name, decoded.record))
            position = reader.position()
            if all(position.get(tp, 0) >= end for tp, end in ends.items()):
                return out
    finally:
        reader.close()
    raise AssertionError(f"{topic}: not read to its end {ends} within {deadline_s:g} s")


def row_of(outcome: dict[str, Any]) -> int:
    """The dataset row an outcome came from: its task id is ``synthetic__<module>-<row>``."""
    return int(outcome["task_id"].rsplit("-", 1)[1])


@pytest.mark.timeout(240)
def test_imported_swe_dataset_becomes_calls_outcomes_sft_samples_of_successful_rows_and_a_trained_version(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    dataset = run_dir / "dataset.parquet"
    summary = write_sample_dataset(dataset, ROWS, bad_rows=1)
    state = run_to_completion(RECIPE, run_dir, duration_s=180, grace_s=30, cwd=tmp_path)
    assert [(s["name"], s["status"]) for s in state["stages"]] == [("import", "completed"), ("sft", "completed")]
    assert state["components"]["import"]["exit_code"] == 0

    bus = open_bus(load_config(run_dir / "orchard.yaml").bus)
    try:
        topics = {t: read_topic(bus, t) for t in (OUTCOMES, MODEL_CALLS, SAMPLES, POLICY_VERSIONS, DEAD_LETTERS)}
    finally:
        bus.close()

    outcomes = [r for name, r in topics[OUTCOMES] if name == "EpisodeOutcome"]
    assert all(o["run_id"] == RUN_ID for o in outcomes)
    assert sorted(row_of(o) for o in outcomes) == list(range(ROWS))  # every good row, once
    assert all(o["success"] == is_successful(row_of(o)) for o in outcomes)
    calls = [r for name, r in topics[MODEL_CALLS] if name == "ModelCall"]
    assert {c["episode_id"] for c in calls} == {o["episode_id"] for o in outcomes}
    assert len(calls) == 3 * ROWS and all(c["retokenized"] and c["run_id"] == RUN_ID for c in calls)

    letters = [r for name, r in topics[DEAD_LETTERS] if name == "DeadLetter"]
    assert [(d["source_topic"], d["source_offset"]) for d in letters] == [(f"file:{dataset}", summary.bad_rows[0])]
    assert f"row {summary.bad_rows[0]}" in letters[0]["reason"]

    successful = {o["episode_id"] for o in outcomes if o["success"]}
    samples = [r for name, r in topics[SAMPLES] if name == "TrainingSample"]
    assert {s["kind"] for s in samples} == {"SFT"} and all(s["run_id"] == RUN_ID for s in samples)
    assert sorted(s["episode_id"] for s in samples) == sorted(successful)  # one per successful row, none else
    assert len(successful) == summary.successful

    versions = [r for name, r in topics[POLICY_VERSIONS] if name == "PolicyVersion" and r["run_id"] == RUN_ID]
    assert versions and max(v["version"] for v in versions) >= 1
    # every sample was on the bus before the trainer started (the import stage's count): it trained each one once
    log_lines = (run_dir / "logs" / "trainer.log").read_text().splitlines()
    steps = [json.loads(line) for line in log_lines if '"component": "trainers.metrics"' in line]
    assert steps and sum(step["samples"] for step in steps) == summary.successful, log_lines[-20:]
