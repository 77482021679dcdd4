"""Whole episodes through the Env: scheduler → local sandbox → real Codex CLI → recording proxy → scripted backend,
then the grader and the outcome — every call recorded and acknowledged before the outcome is published."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall, create_scripted_app
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.local_runtime import LocalRuntime
from orchard.env.scheduler import EpisodeState, Scheduler
from orchard.env.tasks import TaskCatalog
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

pytestmark = [pytest.mark.harness, pytest.mark.slow]
MODEL = "scripted-model"
HARNESSES = Path(__file__).resolve().parents[2] / ".orchard" / "harnesses"
ADMIN = "admin-secret-0123456789"  # noqa: S105 - a test token
TASK_YAML = """\
task_id: write-answer
instruction: Write the word fixed into answer.txt, then stop.
grade_command: sh check.sh
harness_timeout_s: 120
"""
CHECK = 'test "$(cat answer.txt)" = fixed && echo \'{"answer_written": 1.0}\' > .orchard-signals.json\n'


def make_tasks(root: Path) -> Path:
    """One task: the workspace has a README; the grader's check lives in hidden/."""
    task = root / "write-answer"
    (task / "workspace").mkdir(parents=True)
    (task / "workspace" / "README.md").write_text("Write the answer.\n")
    (task / "hidden").mkdir()
    (task / "hidden" / "check.sh").write_text(CHECK)
    (task / "task.yaml").write_text(TASK_YAML)
    return root


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Scripted backend, recording proxy on an embedded bus, local runtime, task catalog."""
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    plan = ScriptedPlan(
        steps=[
            ScriptedStep(
                tool_calls=[ScriptedToolCall(name="exec_command", arguments={"cmd": "echo fixed > answer.txt"})]
            ),
            ScriptedStep(text="Wrote answer.txt."),
        ],
        final_text="nothing left to do",
        model=MODEL,
    )
    backend = BackgroundServer(create_scripted_app(plan, policy_version=5), lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-e2e")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    # The Codex installation may sit under /tmp (a checkout there), which sandboxes see as their own empty tmpfs.
    runtime = LocalRuntime(tmp_path / "sandboxes", shared_paths=[HARNESSES])
    yield {"bus": bus, "proxy": proxy, "runtime": runtime, "tasks": TaskCatalog(make_tasks(tmp_path / "tasks"))}
    runtime.close()
    proxy.stop()
    backend.stop()
    bus.close()


def read(bus: Any, topic: str) -> list[dict[str, Any]]:
    """Every record of a topic, decoded."""
    codec, out = Codec.default(), []
    reader = bus.consumer([topic])
    while batch := reader.poll(max_records=500, timeout_s=0.2):
        out.extend(codec.decode(r.value).record for r in batch)
    return out


def test_codex_episode_is_recorded_graded_and_reported_end_to_end(stack: dict[str, Any]) -> None:
    async def scenario() -> Any:
        admin = ProxyAdmin(stack["proxy"].url, ADMIN)
        runner = LocalEpisodeRunner(
            runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
            producer=stack["bus"].producer(), run_id="run-e2e",
        )  # fmt: skip
        scheduler = Scheduler(runner, concurrency=1, timeout_s=240)
        scheduler.submit({"task_id": "write-answer", "harness": "codex", "model": MODEL}, "ep-codex-1")
        episode = await scheduler.wait("ep-codex-1")
        await admin.aclose()
        return episode

    episode = asyncio.run(scenario())
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.events[-3:])
    assert episode.result["signals"]["answer_written"] == 1.0

    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == "ep-codex-1"]
    assert [c["call_index"] for c in calls] == [0, 1]
    assert {(c["harness"], c["api_flavour"], c["policy_version"]) for c in calls} == {("codex", "RESPONSES", 5)}
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["reward"], outcome["success"]) == (
        "ep-codex-1", "SUCCEEDED", 1.0, True,
    )  # fmt: skip
    assert (outcome["num_model_calls"], outcome["signals"]["answer_written"]) == (2, 1.0)
    assert stack["runtime"].list() == []


def test_an_episode_past_its_timeout_gets_a_timed_out_outcome_and_its_sandbox_removed(stack: dict[str, Any]) -> None:
    async def scenario() -> Any:
        admin = ProxyAdmin(stack["proxy"].url, ADMIN)
        runner = LocalEpisodeRunner(
            runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
            producer=stack["bus"].producer(), run_id="run-e2e",
        )  # fmt: skip
        scheduler = Scheduler(
            runner, concurrency=1, timeout_s=0.2
        )  # far less than sandbox creation plus Codex start-up
        scheduler.submit({"task_id": "write-answer", "harness": "codex", "model": MODEL}, "ep-slow")
        episode = await scheduler.wait("ep-slow")
        await admin.aclose()
        return episode

    episode = asyncio.run(scenario())
    assert episode.state == EpisodeState.TIMED_OUT
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["success"]) == ("ep-slow", "TIMED_OUT", False)
    assert "timeout" in (outcome["error"] or "")
    assert stack["runtime"].list() == []


def test_a_hundred_concurrent_episodes_all_end_with_exactly_one_outcome(stack: dict[str, Any]) -> None:
    async def scenario() -> list[Any]:
        admin = ProxyAdmin(stack["proxy"].url, ADMIN)
        runner = LocalEpisodeRunner(
            runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
            producer=stack["bus"].producer(), run_id="run-e2e",
        )  # fmt: skip
        scheduler = Scheduler(runner, concurrency=16, timeout_s=600)
        ids = [f"ep-many-{i:03d}" for i in range(100)]
        for episode_id in ids:
            scheduler.submit({"task_id": "write-answer", "harness": "codex", "model": MODEL}, episode_id)
        episodes = [await scheduler.wait(episode_id) for episode_id in ids]
        await admin.aclose()
        return episodes

    episodes = asyncio.run(scenario())
    assert {e.state for e in episodes} == {EpisodeState.SUCCEEDED}, [(e.episode_id, e.error) for e in episodes][:5]
    outcomes = read(stack["bus"], OUTCOMES)
    assert sorted(o["episode_id"] for o in outcomes) == [f"ep-many-{i:03d}" for i in range(100)]
    calls = read(stack["bus"], MODEL_CALLS)
    counted: dict[str, int] = {}
    for call in calls:
        counted[call["episode_id"]] = counted.get(call["episode_id"], 0) + 1
    assert counted == {o["episode_id"]: o["num_model_calls"] for o in outcomes}  # outcomes count what is on the bus
    short = [e.episode_id for e in episodes if counted.get(e.episode_id) != 2]
    # Codex hangs up as soon as it has `response.completed`: such a call must still be recorded (it once was not).
    admin = {"Authorization": f"Bearer {ADMIN}"}
    summaries = [httpx.get(f"{stack['proxy'].url}/admin/episodes/{e}", headers=admin).json() for e in short]
    assert short == [], json.dumps(summaries)
    assert stack["runtime"].list() == []
