"""The file-lookup recipe end to end: expert demonstrations (one perfect, two imperfect) run by the built-in harness in
local sandboxes, through the recording proxy to the expert backend, graded by the recipe's grader; each outcome on
the embedded bus carries the documented reward, success and signals, and every model call is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.datasets.conversation import ChatTokenizer
from orchard.engines.expert import ExpertBackend
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Episode, EpisodeState, Scheduler
from orchard.env.tasks import TaskCatalog
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from orchard.trajectory import trajectory_from_records
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.file_lookup.expert import DemoKind, Expert
from recipes.file_lookup.generate import LookupConfig, LookupTask, generate

pytestmark = [pytest.mark.harness]
MODEL = "file-lookup-expert"
ADMIN = "admin-secret-0123456789"  # noqa: S105 - a test token
TASK_ID = "file-lookup-train-00000"
CHAT = ChatTokenizer.load("tiny")  # the policy's tokenizer: demonstrations carry token ids it can be trained on
DEMOS = {  # episode id -> kind, status, success, reward, progress signals, model calls
    "ep-perfect": (DemoKind.PERFECT, "SUCCEEDED", True, 1.0, (1.0, 1.0, 1.0, 1.0), 3),
    "ep-detour": (DemoKind.WRONG_FILE_FIRST, "SUCCEEDED", True, 1.0, (1.0, 1.0, 1.0, 1.0), 4),
    "ep-wrong-key": (DemoKind.WRONG_KEY, "FAILED", False, 0.0, (1.0, 0.0, 1.0, 0.5), 3),
}
"""Signals as (answer_format, answer_correct, right_file, progress)."""
PHASES = ["queued", "started", "sandbox-created", "sandbox-ready", "harness-prepared", "harness-ran", "harness-exited",
          "proxy-closed", "graded", "published", "ended"]  # fmt: skip
"""The events of an episode that ran to its grade (``benchmarks/episodes.py`` times the phases between them)."""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Generated tasks, the expert backend with each demonstration registered, the proxy on an embedded bus, and a
    local runtime."""
    generate(LookupConfig(train_tasks=2, eval_tasks=1), tmp_path / "tasks")
    task = LookupTask.from_directory(tmp_path / "tasks" / "train" / TASK_ID)
    backend = ExpertBackend(model=MODEL, policy_version=2, tokenizer=CHAT)
    expert = Expert()
    for episode_id, (kind, *_) in DEMOS.items():
        backend.register(episode_id, expert.demonstrate(task, episode_id, kind).plan)
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    backend_server = BackgroundServer(backend, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend_server.url}/v1", admin_token=ADMIN, run_id="run-lookup")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    runtime = LocalRuntime(tmp_path / "sandboxes")
    yield {"bus": bus, "proxy": proxy, "runtime": runtime, "tasks": TaskCatalog(tmp_path / "tasks" / "train")}
    runtime.close()
    proxy.stop()
    backend_server.stop()
    bus.close()


def run_episodes(stack: dict[str, Any], requests: dict[str, dict[str, Any]]) -> list[Episode]:
    """Submit each request to a scheduler on the stack and wait for all of them."""

    async def scenario() -> list[Episode]:
        admin = ProxyAdmin(stack["proxy"].url, ADMIN)
        runner = LocalEpisodeRunner(
            runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
            producer=stack["bus"].producer(), run_id="run-lookup",
        )  # fmt: skip
        scheduler = Scheduler(runner, concurrency=len(requests), timeout_s=120)
        for episode_id, request in requests.items():
            scheduler.submit(request, episode_id)
        episodes = [await scheduler.wait(episode_id) for episode_id in requests]
        await admin.aclose()
        return episodes

    return asyncio.run(scenario())


def read(bus: Any, topic: str) -> list[dict[str, Any]]:
    """Every record of a topic, decoded."""
    codec, out = Codec.default(), []
    reader = bus.consumer([topic])
    while batch := reader.poll(max_records=500, timeout_s=0.2):
        out.extend(codec.decode(r.value).record for r in batch)
    return out


def test_expert_demonstrations_run_through_the_harness_and_proxy_and_are_graded_with_partial_credit(
    stack: dict[str, Any],
) -> None:
    request = {"task_id": TASK_ID, "harness": "builtin", "model": MODEL}
    episodes = run_episodes(stack, dict.fromkeys(DEMOS, request))
    assert [e.state.value for e in episodes] == [demo[1] for demo in DEMOS.values()], [e.error for e in episodes]
    assert all(e.state in (EpisodeState.SUCCEEDED, EpisodeState.FAILED) for e in episodes)
    for episode in episodes:  # every phase an event, in order, each no earlier than the one before
        assert [event["kind"] for event in episode.events] == PHASES
        times = [event.get("at", event["time"]) for event in episode.events]
        assert times == sorted(times)

    outcomes = {o["episode_id"]: o for o in read(stack["bus"], OUTCOMES)}
    calls: dict[str, list[int]] = {}
    for call in read(stack["bus"], MODEL_CALLS):
        calls.setdefault(call["episode_id"], []).append(call["call_index"])
        assert (call["harness"], call["policy_version"]) == ("builtin", 2)
    assert sorted(outcomes) == sorted(DEMOS)
    for episode_id, (_, status, success, reward, (fmt, correct, right_file, progress), count) in DEMOS.items():
        outcome = outcomes[episode_id]
        signals = outcome["signals"]
        assert (outcome["status"], outcome["success"], outcome["reward"], outcome["num_model_calls"]) == (
            status, success, reward, count,
        )  # fmt: skip
        assert (signals["answer_format"], signals["answer_correct"], signals["right_file"], signals["progress"]) == (
            fmt, correct, right_file, progress,
        )  # fmt: skip
        assert sorted(calls[episode_id]) == list(range(count))
    assert stack["runtime"].list() == []

    # the policy's own tokens: every recorded id is in its vocabulary, and each call's completion decodes to what
    # the expert did (the scripted expert is deterministic, so its logprobs are 0)
    records: dict[str, list[dict[str, Any]]] = {}
    for call in read(stack["bus"], MODEL_CALLS):
        records.setdefault(call["episode_id"], []).append(call)
    vocabulary = len(CHAT.tokenizer)
    for episode_id, episode_calls in records.items():
        trajectory = trajectory_from_records(episode_calls, outcomes[episode_id])
        for step in trajectory.steps:
            assert int(step.prompt_token_ids.max()) < vocabulary and int(step.completion_token_ids.max()) < vocabulary
            assert not step.completion_logprobs.any()
            decoded = CHAT.tokenizer.decode(step.completion_token_ids.tolist())
            assert any(name in decoded for name in ("shell", "submit")), decoded
