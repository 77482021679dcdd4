"""The trajectory viewer (``orchard view``) over a real run directory: an embedded bus holding codec-encoded
ModelCall, EpisodeOutcome, Trajectory, TrainingSample and StepScore records, a ``state.json`` of two stages, a
``results.json`` and a trainer's ``metrics.jsonl``.

The API answers what was recorded (filters narrow the list, an episode's tokens, mask, advantages and scores are the
recorded ones, new records show up on the next request) and client mistakes are 4xx with a message. In real Chromium
(marker ``browser``): the page lists the episodes, a filter narrows the list, an opened episode shows exactly its
recorded completion tokens, and the curves draw. With ``ORCHARD_VIEWER_SCREENSHOTS=DIR`` the browser test also writes
``list.png``, ``episode.png`` and ``curves.png`` there (``docs/viewer`` holds the committed ones).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from orchard.bus import Bus, open_bus
from orchard.codec import Codec
from orchard.config import BusConfig, EmbeddedBusConfig, OrchardConfig
from orchard.engines.tiny import build_tiny_tokenizer
from orchard.evaluation.results import StageRow, write_table
from orchard.http_server import BackgroundServer
from orchard.run.rundir import RunDir
from orchard.tokens import pack_logprobs, pack_loss_mask, pack_token_ids
from orchard.topics import MODEL_CALLS, OUTCOMES, SAMPLES, SCORES, TRAJECTORIES
from orchard.trajectory_records import trajectory_record
from orchard.viewer import RunView, create_app

CODEC = Codec.default()
RUN_ID = "viewer-run"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SYSTEM = "You are a coding agent. Use the tools."
USER = "Which file is in the directory?"
TOOL_CALL = {"id": "call-1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}
TOOL_OUTPUT = "notes.txt\n"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run", "--mute-audio"]


@functools.cache
def tokenizer() -> Any:
    return build_tiny_tokenizer()


def encode(text: str) -> np.ndarray:
    return np.asarray(tokenizer().encode(text), dtype=np.int32)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ms(seconds: float) -> int:
    return int(at(seconds).timestamp() * 1000)


@dataclass(frozen=True)
class Episode:
    """One recorded episode of the test run: what each topic gets for it."""

    episode_id: str
    task_id: str
    status: str | None  # None: no outcome (only model calls)
    reward: float
    policy_version: int
    ended_s: float
    group_id: str = ""
    calls: int = 1
    on_topics: bool = True  # False: only its Trajectory record carries its calls and outcome
    run_id: str = RUN_ID

    @property
    def group(self) -> str:
        return self.group_id or f"r0-{self.task_id}"


EPISODES = (
    Episode("e-sft-1", "task-a", "SUCCEEDED", 1.0, 0, 10, calls=2),
    Episode("e-sft-2", "task-b", "FAILED", 0.0, 0, 20),
    Episode("e-rl-1", "task-a", "SUCCEEDED", 1.0, 1, 110),
    Episode("e-rl-2", "task-b", "TIMED_OUT", 0.25, 1, 120),
    Episode("e-rl-3", "task-a", "FAILED", 0.0, 1, 130),
    Episode("e-traj-only", "task-c", "FAILED", 0.0, 1, 135, on_topics=False),
    Episode("e-eval-1", "task-c", "SUCCEEDED", 1.0, 1, 140, group_id="eval-rl-task-c"),
    Episode("e-no-outcome", "task-b", None, 0.0, 1, 150),
)


@dataclass(frozen=True)
class RecordedCall:
    """A model call as recorded: full prompt, completion token ids and logprobs, messages."""

    prompt: np.ndarray
    completion: np.ndarray
    logprobs: np.ndarray
    messages: list[dict[str, Any]]
    text: str
    tool_calls: list[dict[str, Any]]


def recorded_calls(episode: Episode) -> list[RecordedCall]:
    """The calls of ``episode``: a tool call then (for a two-call episode) an answer after the tool's output."""
    first_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{USER} ({episode.task_id})"}]
    prompt = encode(
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n"
    )
    completion = encode('<tool_call>{"name": "run", "arguments": {"cmd": "ls"}}</tool_call><|im_end|>')
    calls = [RecordedCall(prompt, completion, _logprobs(len(completion), 0), first_messages, "", [TOOL_CALL])]
    if episode.calls > 1:
        messages = [*first_messages, {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
                    {"role": "tool", "tool_call_id": "call-1", "content": TOOL_OUTPUT}]  # fmt: skip
        prompt = np.concatenate([prompt, completion, encode(f"\n<|im_start|>tool\n{TOOL_OUTPUT}<|im_end|>\n")])
        completion = encode("The file is notes.txt.<|im_end|>")
        calls.append(
            RecordedCall(prompt, completion, _logprobs(len(completion), 1), messages, "The file is notes.txt.", [])
        )
    return calls


def _logprobs(count: int, seed: int) -> np.ndarray:
    return -np.random.default_rng(seed).uniform(0.01, 4.0, size=count).astype(np.float32)


def model_call_bytes(episode: Episode, index: int, call: RecordedCall) -> bytes:
    return CODEC.encode("ModelCall", {
        "run_id": episode.run_id, "episode_id": episode.episode_id, "task_id": episode.task_id, "call_index": index,
        "harness": "builtin", "api_flavour": "CHAT", "model": "policy", "policy_version": episode.policy_version,
        "request_messages_json": json.dumps(call.messages), "response_text": call.text,
        "response_tool_calls_json": json.dumps(call.tool_calls),
        "finish_reason": "tool_calls" if call.tool_calls else "stop",
        "prompt_token_ids": pack_token_ids(call.prompt), "completion_token_ids": pack_token_ids(call.completion),
        "completion_logprobs": pack_logprobs(call.logprobs), "latency_ms": 12.5,
        "timestamp": at(episode.ended_s - 5 + index),
    })  # fmt: skip


def outcome_fields(episode: Episode) -> dict[str, Any]:
    return {
        "run_id": episode.run_id, "episode_id": episode.episode_id, "task_id": episode.task_id,
        "group_id": episode.group,
        "status": episode.status, "reward": episode.reward, "success": episode.status == "SUCCEEDED",
        "signals": {"tests_passed_fraction": episode.reward}, "num_model_calls": episode.calls,
        "policy_version": episode.policy_version, "started_at": at(episode.ended_s - 8),
        "ended_at": at(episode.ended_s),
        "error": "time limit of 60 s" if episode.status == "TIMED_OUT" else None,
    }  # fmt: skip


def sample_record(episode: Episode, calls: list[RecordedCall]) -> dict[str, Any]:
    """The RL sample of a two-call episode: the conversation's sequence, both completions trained but the last token."""
    tokens = np.concatenate([calls[-1].prompt, calls[-1].completion])
    mask = np.zeros(len(tokens), dtype=np.uint8)
    advantages = np.zeros(len(tokens), dtype=np.float32)
    for call, advantage in zip(calls, (0.25, 0.75), strict=True):
        start = len(call.prompt)
        mask[start : start + len(call.completion)] = 1
        advantages[start : start + len(call.completion)] = advantage
    mask[-1], advantages[-1] = 0, 0.0
    return {
        "run_id": episode.run_id, "episode_id": episode.episode_id, "task_id": episode.task_id,
        "group_id": episode.group,
        "sample_id": f"{episode.episode_id}/0", "kind": "RL", "policy_version": episode.policy_version,
        "token_ids": pack_token_ids(tokens), "loss_mask": pack_loss_mask(mask), "advantages": pack_logprobs(advantages),
        "behaviour_logprobs": pack_logprobs(np.zeros(len(tokens))), "reward": episode.reward, "created_at": at(30),
    }  # fmt: skip


def score_bytes(episode: Episode, call_index: int, score: float, span: tuple[int, int] | None) -> bytes:
    return CODEC.encode("StepScore", {
        "run_id": episode.run_id, "episode_id": episode.episode_id, "call_index": call_index,
        "scorer": f"judge-{call_index}",
        "policy_version": episode.policy_version, "token_start": span[0] if span else None,
        "token_end": span[1] if span else None, "score": score, "details_json": '{"why": "answered"}',
        "timestamp": at(episode.ended_s + 1),
    })  # fmt: skip


def produce(bus: Bus, topic: str, values: list[tuple[str, bytes]]) -> None:
    with bus.producer() as producer:
        for key, value in values:
            producer.produce(topic, value, key=key.encode())
        producer.flush()


def publish(bus: Bus, episode: Episode) -> None:
    """Every record of ``episode`` on its topics."""
    calls = [model_call_bytes(episode, i, call) for i, call in enumerate(recorded_calls(episode))]
    key = episode.episode_id
    if episode.on_topics:
        produce(bus, MODEL_CALLS, [(key, call) for call in calls])
    if episode.status is None:
        return
    fields = outcome_fields(episode)
    outcome = CODEC.encode("EpisodeOutcome", fields)
    if episode.on_topics:
        produce(bus, OUTCOMES, [(key, outcome)])
    trajectory = trajectory_record(
        run_id=episode.run_id, episode_id=key, task_id=episode.task_id, calls=calls, outcome=outcome,
        outcome_fields=fields, policy_version=episode.policy_version, timestamp_ms=ms(episode.ended_s),
    )  # fmt: skip
    produce(bus, TRAJECTORIES, [(key, CODEC.encode("Trajectory", trajectory))])


def build_run_dir(root: Path) -> OrchardConfig:
    """A run directory with two stages, held-out rows, a trainer's loss, and every test episode on its bus."""
    config = OrchardConfig(run_id=RUN_ID, bus=EmbeddedBusConfig(path=root / "bus"),
                           store={"type": "local", "path": root / "store"})  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "orchard.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    (root / "recipe.yaml").write_text(yaml.safe_dump({"recipe": "viewer-test", "model": "tiny-llama"}))
    RunDir(root).write_state({"status": "running", "stages": [
        {"name": "sft", "description": "SFT on demonstrations.", "status": "completed",
         "started_at": at(0).timestamp(), "first_started_at": at(0).timestamp(), "ended_at": at(100).timestamp()},
        {"name": "rl", "description": "RL.", "status": "running", "started_at": at(100).timestamp(),
         "first_started_at": at(100).timestamp(), "ended_at": None},
    ]})  # fmt: skip
    write_table(root, [heldout_row("sft", 2, 100), heldout_row("rl", 3, 150)])
    (root / "trainer").mkdir()
    lines = [
        json.dumps({"step": step, "loss": 2.0 / step, "time": at(40 + 10 * step).timestamp()}) for step in (1, 2, 3)
    ]
    (root / "trainer" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    with open_bus(config.bus) as bus:
        for topic in (MODEL_CALLS, OUTCOMES, TRAJECTORIES, SAMPLES, SCORES):
            bus.create_topic(topic, exist_ok=True)
        for episode in EPISODES:
            publish(bus, episode)
        sft = EPISODES[0]
        produce(
            bus, SAMPLES, [(sft.episode_id, CODEC.encode("TrainingSample", sample_record(sft, recorded_calls(sft))))]
        )
        produce(bus, SCORES, [(sft.episode_id, score_bytes(sft, 1, 0.8, (0, 3))),
                              (sft.episode_id, score_bytes(sft, 0, math.nan, None))])  # fmt: skip
    return config


def heldout_row(stage: str, successes: int, evaluated_s: float) -> StageRow:
    when = at(evaluated_s).strftime("%Y-%m-%dT%H:%M:%SZ")
    return StageRow(stage, 4, successes, successes / 4, 0.1, 0.9, successes / 4, None, None, 3.0, evaluated_at=when)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    build_run_dir(tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture
def client(run_dir: Path) -> Iterator[TestClient]:
    config = OrchardConfig(**yaml.safe_load((run_dir / "orchard.yaml").read_text()))
    with TestClient(create_app(RunView(run_dir, config, refresh_s=0.0))) as test_client:
        yield test_client


def episode_ids(client: TestClient, **filters: Any) -> list[str]:
    response = client.get("/api/episodes", params=filters)
    assert response.status_code == 200, response.text
    return sorted(row["episode_id"] for row in response.json()["episodes"])


def ids_where(predicate: Any) -> list[str]:
    return sorted(e.episode_id for e in EPISODES if predicate(e))


def test_the_run_lists_its_stages_and_the_values_each_filter_takes(client: TestClient) -> None:
    run = client.get("/api/run").json()
    assert [(s["name"], s["status"], s["started_ms"], s["ended_ms"], s["episodes"]) for s in run["stages"]] == [
        ("sft", "completed", ms(0), ms(100), 2), ("rl", "running", ms(100), None, 6),
    ]  # fmt: skip
    assert (run["runs"], run["token_mode"], run["undecodable"]) == ({RUN_ID: len(EPISODES)}, "tiny", {})
    assert run["choices"] | {"status": None} == {
        "task": ["task-a", "task-b", "task-c"], "status": None, "stage": ["sft", "rl", "-"], "policy_version": [0, 1],
    }  # fmt: skip


def test_filters_narrow_the_list(client: TestClient) -> None:
    assert episode_ids(client) == ids_where(lambda e: True)
    assert episode_ids(client, status="FAILED") == ids_where(lambda e: e.status == "FAILED")
    assert episode_ids(client, status="NO_OUTCOME") == ["e-no-outcome"]
    assert episode_ids(client, task="task-a") == ids_where(lambda e: e.task_id == "task-a")
    assert episode_ids(client, stage="sft") == ["e-sft-1", "e-sft-2"]
    assert episode_ids(client, policy_version=0) == ["e-sft-1", "e-sft-2"]
    assert episode_ids(client, reward_min=0.2, reward_max=0.9) == ["e-rl-2"]
    assert episode_ids(client, kind="eval") == ["e-eval-1"]
    assert episode_ids(client, kind="train", stage="rl", status="SUCCEEDED") == ["e-rl-1"]
    page = client.get("/api/episodes", params={"limit": 2}).json()
    assert (page["total"], [r["episode_id"] for r in page["episodes"]]) == (len(EPISODES), ["e-no-outcome", "e-eval-1"])


@pytest.mark.parametrize(
    ("path", "params", "status", "message"),
    [
        ("/api/episodes/nope", {}, 404, "no episode 'nope' in this run"),
        ("/api/episodes", {"status": "DONE"}, 422, "status 'DONE' is not one of"),
        ("/api/episodes", {"stage": "ppo"}, 422, "stage 'ppo' is not a stage of this run (sft, rl, -)"),
        ("/api/episodes", {"reward_min": 1, "reward_max": 0}, 422, "reward_min 1.0 is above reward_max 0.0"),
        ("/api/episodes", {"policy_version": "x"}, 422, "policy_version"),
        ("/api/episodes", {"kind": "test"}, 422, "kind"),
        ("/api/episodes", {"limit": 0}, 422, "limit"),
        ("/api/curves", {"window": 0}, 422, "window"),
        ("/api/episodes/e-sft-1/artifacts/0", {}, 404, "episode 'e-sft-1' has 0 artifact(s); there is no number 0"),
    ],
)
def test_client_mistakes_are_4xx_with_a_message(
    client: TestClient, path: str, params: dict[str, Any], status: int, message: str
) -> None:
    response = client.get(path, params=params)
    assert (response.status_code, message in json.dumps(response.json()["detail"])) == (status, True), response.text


def test_an_episode_shows_its_recorded_calls_tokens_samples_scores_and_outcome(client: TestClient) -> None:
    episode = EPISODES[0]
    detail = client.get(f"/api/episodes/{episode.episode_id}").json()
    calls = recorded_calls(episode)
    assert [c["token_ids"] for c in detail["calls"]] == [call.completion.tolist() for call in calls]
    assert [c["token_text"] for c in detail["calls"]] == [
        [tokenizer().decode([i]) for i in call.completion.tolist()] for call in calls
    ]
    assert [c["logprobs"] for c in detail["calls"]] == [call.logprobs.tolist() for call in calls]
    assert [c["request_messages"] for c in detail["calls"]] == [call.messages for call in calls]
    assert [(c["prompt_tokens"], c["response_text"], c["response_tool_calls"]) for c in detail["calls"]] == [
        (len(call.prompt), call.text, call.tool_calls) for call in calls
    ]
    sample_id = f"{episode.episode_id}/0"
    spans = [c["sample_spans"][sample_id] for c in detail["calls"]]
    last = len(calls[1].completion)
    assert [(s["loss_mask"], s["advantages"]) for s in spans] == [
        ([1] * len(calls[0].completion), [0.25] * len(calls[0].completion)),
        ([1] * (last - 1) + [0], [0.75] * (last - 1) + [0.0]),
    ]
    scores = [(s["call_index"], s["scorer"], s["token_start"], s["token_end"], s["score"])
              for c in detail["calls"] for s in c["scores"]]  # fmt: skip
    assert scores == [(0, "judge-0", None, None, None), (1, "judge-1", 0, 3, 0.8)]
    assert detail["outcome"] | {"started_ms": None} == {
        "status": "SUCCEEDED", "reward": 1.0, "success": True, "signals": {"tests_passed_fraction": 1.0},
        "num_model_calls": 2, "artifact_uris": [], "error": None, "group_id": "r0-task-a", "started_ms": None,
        "ended_ms": ms(10),
    }  # fmt: skip
    assert [(s["sample_id"], s["kind"], s["trained_tokens"]) for s in detail["samples"]] == [
        (sample_id, "RL", len(calls[0].completion) + last - 1)
    ]


def test_an_episode_only_on_the_trajectories_topic_is_rebuilt_from_its_trajectory(client: TestClient) -> None:
    detail = client.get("/api/episodes/e-traj-only").json()
    assert (detail["status"], detail["stage"], [c["token_ids"] for c in detail["calls"]]) == (
        "FAILED", "rl", [recorded_calls(EPISODES[5])[0].completion.tolist()]
    )  # fmt: skip


def test_curves_hold_each_stage_s_training_episodes_the_heldout_rows_and_the_trainer_loss(client: TestClient) -> None:
    curves = client.get("/api/curves", params={"window": 2}).json()
    training = curves["training"]
    assert {stage: [(p["episode_id"], p["mean_reward"]) for p in points] for stage, points in training.items()} == {
        "sft": [("e-sft-1", 1.0), ("e-sft-2", 0.5)],
        "rl": [("e-rl-1", 1.0), ("e-rl-2", 0.625), ("e-rl-3", 0.125), ("e-traj-only", 0.0)],
    }  # fmt: skip
    assert [(row["stage"], row["successes"], row["time"]) for row in curves["heldout"]] == [
        ("sft", 2, ms(100)), ("rl", 3, ms(150)),
    ]  # fmt: skip
    assert curves["loss"] == {"trainer": [{"time": float(ms(40 + 10 * s)), "step": float(s), "loss": 2.0 / s}
                                          for s in (1, 2, 3)]}  # fmt: skip


def test_new_records_are_listed_on_the_next_request(client: TestClient, run_dir: Path) -> None:
    assert "e-late" not in episode_ids(client)
    config = OrchardConfig(**yaml.safe_load((run_dir / "orchard.yaml").read_text()))
    with open_bus(config.bus) as bus:
        publish(bus, Episode("e-late", "task-a", "SUCCEEDED", 1.0, 1, 160))
    assert episode_ids(client, status="SUCCEEDED") == ["e-eval-1", "e-late", "e-rl-1", "e-sft-1"]


def test_a_viewer_started_before_the_run_s_topics_exist_picks_them_up(tmp_path: Path) -> None:
    config = OrchardConfig(run_id=RUN_ID, bus=EmbeddedBusConfig(path=tmp_path / "bus"),
                           store={"type": "local", "path": tmp_path / "store"})  # fmt: skip
    with TestClient(create_app(RunView(tmp_path, config, refresh_s=0.0))) as test_client:
        assert (episode_ids(test_client), test_client.get("/api/run").json()["stages"]) == ([], [])
        with open_bus(config.bus) as bus:
            bus.create_topic(OUTCOMES)
            produce(bus, OUTCOMES, [("e-1", CODEC.encode("EpisodeOutcome", outcome_fields(EPISODES[1])))])
        assert episode_ids(test_client) == ["e-sft-2"]


def test_the_viewer_reads_each_bus_backend(bus_config: BusConfig, tmp_path: Path, unique_name: Any) -> None:
    run_id = unique_name("viewer")
    episodes = [Episode(unique_name("e"), "task-a", "SUCCEEDED", 1.0, 1, 10, calls=2, run_id=run_id),
                Episode(unique_name("e"), "task-b", "FAILED", 0.0, 1, 20, run_id=run_id)]  # fmt: skip
    config = OrchardConfig(run_id=run_id, bus=bus_config, store={"type": "local", "path": tmp_path / "store"})
    with open_bus(config.bus) as bus:
        for topic in (MODEL_CALLS, OUTCOMES, TRAJECTORIES):
            bus.create_topic(topic, exist_ok=True)
        for episode in episodes:
            publish(bus, episode)
    with TestClient(create_app(RunView(tmp_path, config, tokens="ids", refresh_s=0.0))) as test_client:
        assert episode_ids(test_client, run=run_id) == sorted(e.episode_id for e in episodes)
        detail = test_client.get(f"/api/episodes/{episodes[0].episode_id}").json()
        assert ([c["token_ids"] for c in detail["calls"]], detail["calls"][0]["token_text"]) == (
            [call.completion.tolist() for call in recorded_calls(episodes[0])], None
        )  # fmt: skip


def test_the_view_command_reads_the_run_directory_config(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchard.cli.main import app

    served: dict[str, Any] = {}
    monkeypatch.setattr("uvicorn.run", lambda asgi, **options: served.update(app=asgi, **options))
    result = CliRunner().invoke(app, ["view", str(run_dir), "--port", "8601"])
    assert (result.exit_code, served["host"], served["port"]) == (0, "127.0.0.1", 8601), result.output
    with TestClient(served["app"]) as test_client:
        assert test_client.get("/api/run").json()["run_dir"] == str(run_dir.resolve())
    missing = CliRunner().invoke(app, ["view", str(run_dir / "absent")])
    assert missing.exit_code == 1


@pytest.mark.browser
def test_the_page_lists_filters_and_shows_an_episode_s_exact_tokens_in_chromium(run_dir: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    shots = os.environ.get("ORCHARD_VIEWER_SCREENSHOTS")
    config = OrchardConfig(**yaml.safe_load((run_dir / "orchard.yaml").read_text()))
    with (
        BackgroundServer(create_app(RunView(run_dir, config, refresh_s=0.5))) as server,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            check_the_page(page, server.url, Path(shots) if shots else None)
        finally:
            browser.close()


def check_the_page(page: Any, url: str, shots: Path | None) -> None:
    rows = page.locator("#episodes tbody tr")
    page.goto(url)
    page.wait_for_function(f"document.querySelectorAll('#episodes tbody tr').length === {len(EPISODES)}")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.episodeId)")) == ids_where(lambda e: True)
    page.wait_for_function("document.querySelectorAll('#filters select[name=status] option').length > 1")
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "list.png"), full_page=True)
    page.select_option("#filters select[name=status]", "FAILED")
    failed = ids_where(lambda e: e.status == "FAILED")
    page.wait_for_function(f"document.querySelectorAll('#episodes tbody tr').length === {len(failed)}")
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.episodeId)")) == failed
    page.select_option("#filters select[name=status]", "")
    page.select_option("#filters select[name=task]", "task-a")
    task_a = ids_where(lambda e: e.task_id == "task-a")
    page.wait_for_function(f"document.querySelectorAll('#episodes tbody tr').length === {len(task_a)}")
    page.click("#episodes tbody tr[data-episode-id='e-sft-1']")
    page.wait_for_selector("#episode-title")
    calls = recorded_calls(EPISODES[0])
    for index, call in enumerate(calls):
        spans = page.locator(f".tokens[data-call-index='{index}'] .tok")
        shown = spans.evaluate_all("ts => ts.map(t => [Number(t.dataset.id), t.textContent])")
        assert shown == [[i, tokenizer().decode([i])] for i in call.completion.tolist()]
    assert page.locator(".msg.role-tool pre").first.text_content() == TOOL_OUTPUT
    if shots:
        page.screenshot(path=str(shots / "episode.png"), full_page=True)
    page.select_option("#colour", "adv:e-sft-1/0")
    masks = page.locator(".tokens[data-call-index='1'] .tok").evaluate_all("ts => ts.map(t => t.dataset.mask)")
    assert masks == ["1"] * (len(calls[1].completion) - 1) + ["0"]
    if shots:
        page.locator(".call[data-call-index='1']").screenshot(path=str(shots / "advantages.png"))
    page.goto(f"{url}/#/episode/nope")
    page.wait_for_selector("#episode-error")
    page.goto(f"{url}/#/curves")
    page.wait_for_selector("#reward-chart polyline")
    assert page.locator("#heldout tbody tr").count() == 2
    if shots:
        page.screenshot(path=str(shots / "curves.png"), full_page=True)
