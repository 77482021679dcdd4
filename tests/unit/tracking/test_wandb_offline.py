"""The follower's W&B run, offline: read back from the ``.wandb`` files wandb writes (a LevelDB-style log of
protobuf ``Record``s), with each namespace on its own step metric, and a resumed follower adding only what is new."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.topics import OUTCOMES
from orchard.tracking import Follower, WandbTrackerConfig, open_tracker
from orchard.tracking.wandb_tracker import wandb_run_id

pytest.importorskip("wandb")

RUN_ID = "r1"
BLOCK = 32 * 1024
HEADER = 7  # b":W&B", magic 0xBEE1, version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@pytest.fixture(autouse=True)
def _wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep wandb's settings and caches inside the test, and away from any real account."""
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def wandb_records(path: Path) -> list[bytes]:
    """The records of a ``.wandb`` file: 32 KiB blocks of chunks (CRC u32, length u16, type u8, data)."""
    data, out, chunks, at = path.read_bytes(), [], b"", HEADER
    assert data[:4] == b":W&B"
    while at + 7 <= len(data):
        if BLOCK - at % BLOCK < 7:
            at += BLOCK - at % BLOCK  # a block's tail too short for a chunk header is padding
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if kind == 0:
            at += BLOCK - at % BLOCK
            continue
        chunks += data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind in (FULL, LAST):
            out.append(chunks)
            chunks = b""
    return out


def run_records(path: Path, wait_s: float = 10.0) -> list[Any]:
    """The protobuf records of one offline run, once its file ends with the ``exit`` record (wandb's service
    process may still be writing the file when ``finish()`` returns)."""
    from wandb.proto.wandb_internal_pb2 import Record

    deadline = time.monotonic() + wait_s
    while True:
        records = [Record.FromString(raw) for raw in wandb_records(path)]
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def history(wandb_dir: Path) -> list[dict[str, Any]]:
    """Every logged row of every offline run under ``wandb_dir``, in order."""
    rows = []
    for path in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        for record in run_records(path):
            if record.WhichOneof("record_type") == "history":
                row: dict[str, Any] = {}
                for item in record.history.item:  # a logged table is a dict: one item per key, nested under its name
                    *parents, leaf = [item.key] if item.key else item.nested_key
                    target = row
                    for parent in parents:
                        target = target.setdefault(parent, {})
                    target[leaf] = json.loads(item.value_json)
                rows.append(row)
    return rows


def series(rows: list[dict[str, Any]], name: str) -> list[tuple[int, Any]]:
    """``(step, value)`` of ``name`` on its namespace's step metric."""
    step = name.rpartition("/")[0] + "/step"
    return [(row[step], row[name]) for row in rows if name in row]


def sync_once(run_dir: Path) -> None:
    tracker = open_tracker(WandbTrackerConfig(), run_dir, RUN_ID)
    state = run_dir / "tracking" / "wandb.state.json"
    follower = Follower(run_dir, RUN_ID, tracker, state, bus=EmbeddedBusConfig(path=run_dir / "bus"), samples=2)
    try:
        follower.sync(final=True)
    finally:
        follower.close()


def outcome(episode: str, version: int) -> dict[str, Any]:
    return {
        "run_id": RUN_ID,
        "episode_id": episode,
        "task_id": f"task-{episode}",
        "group_id": "g",
        "status": "SUCCEEDED",
        "reward": 1.0,
        "success": True,
        "signals": {},
        "num_model_calls": 1,
        "artifact_uris": [],
        "policy_version": version,
        "started_at": 0,
        "ended_at": 1000,
        "error": None,
    }


def publish(run_dir: Path, outcomes: list[dict[str, Any]]) -> None:
    codec = Codec.default()
    with open_bus(EmbeddedBusConfig(path=run_dir / "bus")) as bus, bus.producer() as producer:
        bus.create_topic(OUTCOMES, exist_ok=True)
        for record in outcomes:
            producer.send(OUTCOMES, codec.encode("EpisodeOutcome", record), key=record["episode_id"].encode())


def metrics_line(step: int, loss: float, version: int) -> str:
    return json.dumps({"step": step, "time": 1_700_000_000 + step, "loss": loss, "policy_version": version}) + "\n"


def test_an_offline_run_reads_back_and_a_resumed_follower_adds_only_new_points(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "policy").mkdir(parents=True)
    (run_dir / "policy" / "metrics.jsonl").write_text(metrics_line(1, 0.9, 1) + metrics_line(2, 0.7, 2))
    row = {
        "stage": "rl",
        "tasks": 2,
        "successes": 1,
        "success_rate": 0.5,
        "success_ci_low": 0.1,
        "success_ci_high": 0.9,
        "mean_reward": 0.5,
        "reward_ci_low": None,
        "reward_ci_high": None,
        "wall_time_s": 1,
    }
    (run_dir / "results.json").write_text(json.dumps({"format": 1, "stages": [row]}))
    publish(run_dir, [outcome("a", 1)])
    (run_dir / "state.json").write_text(json.dumps({"status": "completed", "stages": [
        {"name": "rl", "first_started_at": 1_700_000_000, "ended_at": None}]}))  # fmt: skip
    sync_once(run_dir)
    with (run_dir / "policy" / "metrics.jsonl").open("a") as file:
        file.write(metrics_line(3, 0.5, 2))
    sync_once(run_dir)

    wandb_dir = run_dir / "tracking" / "wandb"
    rows = history(wandb_dir)
    assert series(rows, "trainer/policy/loss") == [(1, 0.9), (2, 0.7), (3, 0.5)]
    assert series(rows, "trainer/policy/policy_version") == [(1, 1.0), (2, 2.0), (3, 2.0)]
    assert series(rows, "trainer/policy/stage") == [(1, "rl"), (2, "rl"), (3, "rl")]
    runs = {r.run.run_id for path in wandb_dir.glob("offline-run-*/run-*.wandb") for r in run_records(path)
            if r.WhichOneof("record_type") == "run"}  # fmt: skip
    assert (len(list(wandb_dir.glob("offline-run-*"))), runs) == (2, {wandb_run_id(RUN_ID, run_dir)})
    assert series(rows, "eval/success_rate") == [(0, 0.5)]
    assert series(rows, "outcomes/episodes") == [(1, 1.0)]
    [(step, table)] = series(rows, "samples/episodes")
    assert (step, table["_type"], table["ncols"], table["nrows"]) == (1, "table-file", 5, 1)
    [table_file] = wandb_dir.glob(f"offline-run-*/files/{table['path']}")
    assert json.loads(table_file.read_text())["data"] == [["a", "task-a", "SUCCEEDED", 1.0, True]]
