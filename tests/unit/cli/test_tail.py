"""``orchard tail`` on an embedded bus holding real records: episodes recorded by ``EpisodeRecorder``, their
trajectories in the assembler's wire form, and a dead letter; nested records read back as JSON."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from consumers.synthetic import SyntheticEpisode, synthetic_episode
from orchard.bus import open_bus
from orchard.cli.main import app
from orchard.cli.record_json import SUMMARY_EDGE
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.tokens import unpack_array
from orchard.topics import DEAD_LETTERS, MODEL_CALLS, OUTCOMES, TRAJECTORIES
from orchard.trajectory_records import trajectory_record

CODEC = Codec.default()
EPISODES = {"ep-a": "alpha", "ep-b": "beta"}
CALLS = 3


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, SyntheticEpisode]]:
    """A config file naming an embedded bus with two episodes' calls, outcomes, trajectories and a dead letter."""
    root = tmp_path_factory.mktemp("tail")
    sizes = {"first_prompt_tokens": 40, "completion_tokens": 12, "tool_output_tokens": 10}
    episodes = {
        episode_id: synthetic_episode(episode_id, calls=CALLS, seed=i, run_id="r1", task_id=task, **sizes)
        for i, (episode_id, task) in enumerate(EPISODES.items())
    }
    bus = open_bus(EmbeddedBusConfig(path=root / "bus"))
    try:
        for topic, partitions in ((MODEL_CALLS, 4), (OUTCOMES, 1), (TRAJECTORIES, 4), (DEAD_LETTERS, 1)):
            bus.create_topic(topic, partitions)
        with bus.producer() as producer:
            for episode in episodes.values():
                for captured in episode.records:
                    producer.send(captured.topic, captured.value, key=captured.key)
                    time.sleep(0.002)  # distinct timestamps: "the last N" is then one answer
                producer.send(TRAJECTORIES, CODEC.encode("Trajectory", _trajectory(episode)),
                              key=episode.episode_id.encode())  # fmt: skip
            producer.send(DEAD_LETTERS, CODEC.encode("DeadLetter", _dead_letter(episodes["ep-a"])))
    finally:
        bus.close()
    config = root / "orchard.yaml"
    config.write_text(f"bus: {{type: embedded, path: {root / 'bus'}}}\n")
    return config, episodes


def _trajectory(episode: SyntheticEpisode) -> dict[str, Any]:
    outcome = CODEC.decode(episode.outcome.value).record
    return trajectory_record(
        run_id="r1", episode_id=episode.episode_id, task_id=outcome["task_id"], calls=[c.value for c in episode.calls],
        outcome=episode.outcome.value, outcome_fields=outcome, policy_version=1, timestamp_ms=1_000,
    )  # fmt: skip


def _dead_letter(episode: SyntheticEpisode) -> dict[str, Any]:
    return {"original": episode.calls[1].value, "source_topic": MODEL_CALLS, "source_partition": 0,
            "source_offset": 1, "source_key": episode.episode_id.encode(), "reason": "test", "error_type": "Test",
            "consumer_group": "assembler", "timestamp": 2_000}  # fmt: skip


def tail(config: Path, *args: str, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``orchard --config CONFIG tail ARGS...`` in this process; its JSON lines."""
    for name in [k for k in os.environ if k.startswith("ORCHARD_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["--config", str(config), "tail", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_a_trajectory_shows_its_calls_and_outcome_as_decoded_records(recorded, monkeypatch) -> None:
    config, episodes = recorded
    [line] = tail(config, TRAJECTORIES, "--episode", "ep-a", monkeypatch=monkeypatch)
    record, episode = line["record"], episodes["ep-a"]
    assert (line["schema"], record["episode_id"], record["task_id"]) == ("Trajectory/v1", "ep-a", "alpha")
    assert [call["schema"] for call in record["calls"]] == ["ModelCall/v3"] * CALLS
    calls = [CODEC.decode(c.value).record for c in episode.calls]
    assert [c["record"]["completion_token_ids"] for c in record["calls"]] == [
        unpack_array(c["completion_token_ids"], "int32").tolist() for c in calls
    ]
    assert [c["record"]["request_messages_json"] for c in record["calls"]] == [
        json.loads(c["request_messages_json"]) for c in calls
    ]
    assert record["calls"][0]["record"]["response_tool_calls_json"][0]["function"]["name"] == "shell"
    outcome = CODEC.decode(episode.outcome.value).record
    assert record["outcome"]["schema"] == "EpisodeOutcome/v2"
    assert {k: record["outcome"]["record"][k] for k in ("episode_id", "reward", "status", "signals")} == {
        "episode_id": "ep-a", "reward": outcome["reward"], "status": outcome["status"], "signals": outcome["signals"],
    }  # fmt: skip


def test_n_prints_the_last_records_oldest_first(recorded, monkeypatch) -> None:
    config, _ = recorded
    everything = tail(config, MODEL_CALLS, monkeypatch=monkeypatch)
    newest = sorted(everything, key=lambda line: (line["timestamp"], line["partition"], line["offset"]))[-4:]
    assert tail(config, MODEL_CALLS, "-n", "4", monkeypatch=monkeypatch) == newest
    outcomes = tail(config, OUTCOMES, "-n", "1", monkeypatch=monkeypatch)
    assert [(line["offset"], line["record"]["episode_id"]) for line in outcomes] == [(1, "ep-b")]
    assert len(tail(config, OUTCOMES, "-n", "50", monkeypatch=monkeypatch)) == len(EPISODES)


def test_episode_and_task_filters_select_whole_episodes(recorded, monkeypatch) -> None:
    config, _ = recorded
    calls = tail(config, MODEL_CALLS, "--task", "beta", monkeypatch=monkeypatch)
    assert sorted((c["record"]["episode_id"], c["record"]["call_index"]) for c in calls) == [
        ("ep-b", i) for i in range(CALLS)
    ]
    last = tail(config, MODEL_CALLS, "--episode", "ep-a", "-n", "1", monkeypatch=monkeypatch)
    assert [(c["record"]["episode_id"], c["record"]["call_index"]) for c in last] == [("ep-a", CALLS - 1)]
    assert tail(config, OUTCOMES, "--episode", "ep-a", "--task", "beta", monkeypatch=monkeypatch) == []


def test_a_dead_letter_shows_its_original_decoded_and_is_found_by_its_episode(recorded, monkeypatch) -> None:
    config, episodes = recorded
    [letter] = tail(config, DEAD_LETTERS, "--episode", "ep-a", monkeypatch=monkeypatch)
    original = letter["record"]["original"]
    assert (original["schema"], original["record"]["call_index"]) == ("ModelCall/v3", 1)
    assert letter["record"]["source_key"] == base64.b64encode(b"ep-a").decode()  # not a record: kept as base64
    assert tail(config, DEAD_LETTERS, "--episode", "ep-b", monkeypatch=monkeypatch) == []


def test_token_summary_keeps_the_length_and_both_ends_of_long_arrays(recorded, monkeypatch) -> None:
    config, episodes = recorded
    lines = tail(config, MODEL_CALLS, "--episode", "ep-b", "--tokens", "summary", monkeypatch=monkeypatch)
    [first] = [line["record"] for line in lines if line["record"]["call_index"] == 0]
    call = CODEC.decode(episodes["ep-b"].calls[0].value).record
    prompt = unpack_array(call["prompt_token_ids"], "int32").tolist()
    assert len(prompt) > 2 * SUMMARY_EDGE
    assert first["prompt_token_ids"] == {
        "length": len(prompt), "first": prompt[:SUMMARY_EDGE], "last": prompt[-SUMMARY_EDGE:],
    }  # fmt: skip
    assert first["completion_token_ids"] == unpack_array(call["completion_token_ids"], "int32").tolist()  # short
