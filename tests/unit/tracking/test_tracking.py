"""The follower sends a fake run's metrics.jsonl, results.json and bus outcomes to TensorBoard and W&B (offline);
both are read back from the files they wrote, and a second pass sends only what is new."""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchard.bus import open_bus
from orchard.cli.main import app
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.topics import OUTCOMES
from orchard.tracking import Follower, TensorBoardTrackerConfig, TrackerUnavailableError, follow, open_tracker

pytest.importorskip("tensorboardX")

RUN_ID = "r1"
T0 = 1_700_000_000  # seconds


# ----------------------------------------------------------------------------------------- the fake run directory
def metrics_line(step: int, loss: float, version: int) -> str:
    return json.dumps({"step": step, "time": T0 + step, "loss": loss, "lr": 1e-5, "policy_version": version,
                       "tokens_per_second": 100.0 * step, "flag": True, "note": "x"}) + "\n"  # fmt: skip


def heldout_row(stage: str, successes: int, evaluated_at: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
    return {"stage": stage, "tasks": 4, "successes": successes, "success_rate": successes / 4, "success_ci_low": 0.0,
            "success_ci_high": 1.0, "mean_reward": successes / 4, "reward_ci_low": None, "reward_ci_high": None,
            "wall_time_s": 2.0, "evaluated_at": evaluated_at}  # fmt: skip


def outcome(episode: str, version: int | None, success: bool, ended_s: float, group: str = "g") -> dict[str, Any]:
    ended_ms = int((T0 + ended_s) * 1000)
    return {"run_id": RUN_ID, "episode_id": episode, "task_id": f"task-{episode}", "group_id": group,
            "status": "SUCCEEDED" if success else "FAILED", "reward": 1.0 if success else 0.0, "success": success,
            "signals": {}, "num_model_calls": 1, "artifact_uris": [], "policy_version": version,
            "started_at": ended_ms - 500, "ended_at": ended_ms, "error": None}  # fmt: skip


def publish(run_dir: Path, outcomes: list[dict[str, Any]]) -> None:
    codec = Codec.default()
    with open_bus(EmbeddedBusConfig(path=run_dir / "bus")) as bus:
        bus.create_topic(OUTCOMES, partitions=2, exist_ok=True)
        with bus.producer() as producer:
            for record in outcomes:
                producer.send(OUTCOMES, codec.encode("EpisodeOutcome", record), key=record["episode_id"].encode())


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished run: trainer ``policy`` with 3 steps (and half a 4th), two held-out stages, outcomes of v1 and v2."""
    root = tmp_path / "run"
    (root / "policy").mkdir(parents=True)
    (root / "policy" / "metrics.jsonl").write_text(
        metrics_line(1, 0.9, 1) + metrics_line(2, 0.7, 1) + metrics_line(3, 0.5, 2) + '{"step": 4, "lo'
    )
    (root / "results.json").write_text(json.dumps({"format": 1, "stages": [heldout_row("base", 1),
                                                                             heldout_row("rl", 3)]}))  # fmt: skip
    (root / "state.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "stages": [
                    {"name": "sft", "first_started_at": T0, "ended_at": T0 + 2},
                    {"name": "rl", "started_at": T0 + 2.5},
                ],
            }
        )
    )
    (root / "orchard.yaml").write_text(json.dumps({"run_id": RUN_ID, "bus": {"type": "embedded",
                                                                             "path": str(root / "bus")}}))  # fmt: skip
    publish(root, [
        outcome("a", 1, True, 10), outcome("b", 1, False, 12), outcome("c", 1, True, 14),
        outcome("e", None, True, 11), outcome("v", 1, True, 11, group="eval-base-t"),
        outcome("d", 2, True, 20), outcome("f", 1, True, 21),  # f: a straggler of v1, after v2 began
    ])  # fmt: skip
    return root


# ----------------------------------------------------------------------------------------- reading back
def tfrecords(path: Path) -> list[bytes]:
    """The records of a TFRecord file: length (u64), its CRC, data, data CRC."""
    data, out, at = path.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return out


def tensorboard_points(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[tuple[int, str]]]]:
    """Scalars (tag -> [(step, value)]) and texts (tag -> [(step, text)]) of every event file under ``logdir``."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = defaultdict(list)
    texts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        for raw in tfrecords(path):
            event = Event.FromString(raw)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars[value.tag].append((event.step, round(value.simple_value, 5)))
                else:
                    texts[value.tag].append((event.step, value.tensor.string_val[0].decode()))
    return dict(scalars), dict(texts)


def tensorboard_follower(run_dir: Path, samples: int = 2) -> Follower:
    tracker = open_tracker(TensorBoardTrackerConfig(), run_dir, RUN_ID)
    state = run_dir / "tracking" / "tensorboard.state.json"
    return Follower(run_dir, RUN_ID, tracker, state, bus=EmbeddedBusConfig(path=run_dir / "bus"), samples=samples)


def sync_once(run_dir: Path, *, final: bool) -> int:
    follower = tensorboard_follower(run_dir)
    try:
        return follower.sync(final=final)
    finally:
        follower.close()


EXPECTED_SCALARS = {
    "trainer/policy/loss": [(1, 0.9), (2, 0.7), (3, 0.5)],
    "trainer/policy/lr": [(1, 1e-5), (2, 1e-5), (3, 1e-5)],
    "trainer/policy/policy_version": [(1, 1.0), (2, 1.0), (3, 2.0)],
    "trainer/policy/tokens_per_second": [(1, 100.0), (2, 200.0), (3, 300.0)],
    **{f"eval/{stage}/{name}": [(pos, value)] for stage, pos, ok in (("base", 0, 1), ("rl", 1, 3)) for name, value in
       {"success_rate": ok / 4, "success_ci_low": 0.0, "success_ci_high": 1.0, "mean_reward": ok / 4, "tasks": 4.0,
        "successes": float(ok), "missing": 0.0, "wall_time_s": 2.0}.items()},
    "eval/success_rate": [(0, 0.25), (1, 0.75)],
    "eval/mean_reward": [(0, 0.25), (1, 0.75)],
    "outcomes/episodes": [(1, 3.0), (2, 1.0)],
    "outcomes/success_rate": [(1, round(2 / 3, 5)), (2, 1.0)],
    "outcomes/mean_reward": [(1, round(2 / 3, 5)), (2, 1.0)],
    "outcomes/episodes_per_s": [(1, 0.75)],  # 3 episodes from t=10 s to t=14 s; v2 has one episode: no rate
    "outcomes/late_episodes": [(1, 0.0), (2, 1.0)],
}  # fmt: skip


def test_a_finished_run_reads_back_from_the_tensorboard_event_files(run_dir: Path) -> None:
    assert sync_once(run_dir, final=True) == 3 + 2 + 4  # 3 steps, 2 stages, 2 versions x (scalars + table)
    scalars, texts = tensorboard_points(run_dir / "tracking" / "tensorboard")
    assert scalars == EXPECTED_SCALARS
    assert texts == {
        "samples/episodes/text_summary": [
            (1, "| episode_id | task_id | status | reward | success |\n| --- | --- | --- | --- | --- |\n"
                "| a | task-a | SUCCEEDED | 1.0 | True |\n| b | task-b | FAILED | 0.0 | False |"),
            (2, "| episode_id | task_id | status | reward | success |\n| --- | --- | --- | --- | --- |\n"
                "| d | task-d | SUCCEEDED | 1.0 | True |"),
        ]
    }  # fmt: skip


def test_passes_resume_from_the_state_without_sending_a_point_twice(run_dir: Path) -> None:
    assert sync_once(run_dir, final=False) == 3 + 2 + 2  # v2 still open: only v1 is sent
    assert sync_once(run_dir, final=False) == 0
    with (run_dir / "policy" / "metrics.jsonl").open("a") as file:
        file.write('ss": 0.3}\n' + metrics_line(5, 0.2, 2))  # completes the half-written step 4
    rows = json.loads((run_dir / "results.json").read_text())
    rows["stages"][1] = heldout_row("rl", 4, evaluated_at="2026-12-02T00:00:00Z")  # rl evaluated again
    (run_dir / "results.json").write_text(json.dumps(rows))
    publish(run_dir, [outcome("g", 2, False, 22)])
    assert sync_once(run_dir, final=True) == 2 + 1 + 2  # steps 4 and 5, the new rl row, v2 closed
    scalars, _ = tensorboard_points(run_dir / "tracking" / "tensorboard")
    assert scalars["trainer/policy/loss"] == [(1, 0.9), (2, 0.7), (3, 0.5), (4, 0.3), (5, 0.2)]
    assert scalars["eval/rl/success_rate"] == [(1, 0.75), (1, 1.0)]
    assert scalars["outcomes/episodes"] == [(1, 3.0), (2, 2.0)]
    assert scalars["outcomes/episodes_per_s"] == [(1, 0.75), (2, 1.0)]  # d at 20 s, g at 22 s


def test_the_cli_sends_a_finished_run_and_a_rerun_sends_nothing(run_dir: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(app, ["track", str(run_dir), "--to", "tensorboard"])
    second = runner.invoke(app, ["track", str(run_dir), "--to", "tensorboard"])
    assert (first.exit_code, first.output, second.output) == (0, "tensorboard: sent 9 points\n",
                                                              "tensorboard: sent 0 points\n")  # fmt: skip
    assert tensorboard_points(run_dir / "tracking" / "tensorboard")[0] == EXPECTED_SCALARS


def test_an_unknown_tracker_is_a_usage_error(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["track", str(run_dir), "--to", "mlflow"])
    assert result.exit_code == 2
    assert "the trackers are 'tensorboard' and 'wandb'" in result.output


def test_a_missing_tracker_package_names_the_extra(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX now raises ImportError
    with pytest.raises(TrackerUnavailableError, match=r"pip install 'orchard-rl\[tracking\]'"):
        open_tracker(TensorBoardTrackerConfig(), run_dir, RUN_ID)


def test_following_a_running_run_ends_with_it_and_closes_the_newest_version(run_dir: Path) -> None:
    state = json.loads((run_dir / "state.json").read_text())
    (run_dir / "state.json").write_text(json.dumps(state | {"status": "running"}))
    logdir, seen = run_dir / "tracking" / "tensorboard", []
    follower = tensorboard_follower(run_dir)

    def stop() -> bool:  # never asked to stop: the run ends once v1 is in the event files
        seen.append(tensorboard_points(logdir)[0].get("outcomes/episodes") if logdir.exists() else None)
        if seen[-1] == [(1, 3.0)]:
            (run_dir / "state.json").write_text(json.dumps(state))
        return False

    try:
        follow([follower], run_dir, poll_s=0.1, stop=stop)
    finally:
        follower.close()
    assert [(1, 3.0)] in seen and [(1, 3.0), (2, 1.0)] not in seen  # v2 waited for the run's end
    assert tensorboard_points(logdir)[0] == EXPECTED_SCALARS
