"""Reranking recorded candidates (``orchard eval --rerank K --source/--topic``): a run's trajectories read from the
bus, its newest value model fetched from the store, the picks written as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.evaluation.exceptions import EvaluationError
from orchard.evaluation.rerank import download_value_model, read_run_trajectories, write_picks
from orchard.rerank_candidates import RerankResult
from orchard.store import open_store
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()


def trajectory(run_id: str, episode_id: str) -> bytes:
    """An encoded Trajectory record without calls or outcome."""
    record = trajectory_record(run_id=run_id, episode_id=episode_id, task_id="t", calls=[], outcome=None,
                               outcome_fields=None, policy_version=None, timestamp_ms=0)  # fmt: skip
    return CODEC.encode("Trajectory", record)


def test_the_run_s_trajectories_are_read_from_the_start_of_the_topic_others_left_out(tmp_path: Path) -> None:
    values = [trajectory("run", "e1"), trajectory("other", "e2"), trajectory("run", "e3")]
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic("trajectories", partitions=1)
        with bus.producer() as producer:
            for value in values:
                producer.produce("trajectories", value)

        read = read_run_trajectories(bus, "trajectories", "run", idle_polls=1)

    assert [(t.run_id, t.episode_id) for t in read] == [("run", "e1"), ("run", "e3")]


def test_the_picks_are_written_one_json_line_per_task_by_task_id(tmp_path: Path) -> None:
    picks = {"u": RerankResult("c", 0, (0.25,)), "t": RerankResult("b", 1, (0.5, 0.75))}

    write_picks(tmp_path / "picks.jsonl", picks)

    assert [json.loads(line) for line in (tmp_path / "picks.jsonl").read_text().splitlines()] == [
        {"task_id": "t", "candidate_id": "b", "score": 0.75},
        {"task_id": "u", "candidate_id": "c", "score": 0.25},
    ]


def test_the_newest_published_value_model_is_downloaded(tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    with open_store(LocalStoreConfig(path=tmp_path / "store")) as store:
        for version in (1, 2):
            weights.write_bytes(f"v{version}".encode())
            store.publish_version("runs/run/value", version, {"weights.bin": weights})

        fetched = download_value_model(store, "run", "value", tmp_path / "model")

    assert (fetched, (tmp_path / "model" / "weights.bin").read_bytes()) == (("runs/run/value", 2), b"v2")


def test_a_run_without_a_published_value_model_is_an_evaluation_error(tmp_path: Path) -> None:
    with open_store(LocalStoreConfig(path=tmp_path / "store")) as store, pytest.raises(EvaluationError) as raised:
        download_value_model(store, "run", "value", tmp_path / "model")

    assert str(raised.value) == f"no published value model runs/run/value in {store.location}; pass --value-model"
