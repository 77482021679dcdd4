"""A whole Claw episode: scheduler → local sandbox → the Claw agent (``claw`` harness) with the services running in the
sandbox → recording proxy → the scripted expert replaying the task's reference solution, then the task's grader
reading the services' final state. The expert books a meeting a mail asks for and replies with its time, through
mail and calendar tools; every model call is recorded, and the outcome on the bus is SUCCEEDED."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.engines.expert import ExpertBackend
from orchard.env.scheduler import EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.claw.expert import MODEL, solution_plan
from recipes.claw.harness import register
from recipes.claw.tasks import ClawConfig, generate, load_solutions
from tests.integration.test_episodes import ADMIN, RequestLog, read, run_episodes

pytestmark = [pytest.mark.harness]
TASK_ID = "claw-train-meeting-request-000"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Generated Claw tasks, the expert backend, the recording proxy on an embedded bus, a local runtime, and the
    ``claw`` harness registered."""
    register()
    generate(ClawConfig(train_per_kind=1, eval_per_kind=1), tmp_path / "tasks")
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    expert = ExpertBackend(model=MODEL, policy_version=3)
    backend_log = RequestLog(expert)
    backend = BackgroundServer(backend_log, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-claw")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    runtime = LocalRuntime(tmp_path / "sandboxes", hidden_paths=[tmp_path / "tasks"])
    yield {
        "expert": expert, "backend_log": backend_log, "bus": bus, "proxy": proxy, "runtime": runtime,
        "tasks": TaskCatalog(tmp_path / "tasks" / "train"), "out": tmp_path / "tasks",
    }  # fmt: skip
    runtime.close()
    proxy.stop()
    backend.stop()
    bus.close()


def test_the_expert_books_a_requested_meeting_through_the_claw_agent_and_the_grader_accepts_the_final_state(
    stack: dict[str, Any],
) -> None:
    reference = load_solutions(stack["out"], "train", TASK_ID)["reference"]
    plan = solution_plan(reference)
    episode_id = "claw-ep-1"
    stack["expert"].register(episode_id, plan)
    [episode] = run_episodes(
        stack, {episode_id: {"task_id": TASK_ID, "harness": "claw", "model": MODEL}}, timeout_s=120
    )
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.result, episode.events[-3:])
    signals = episode.result["signals"]
    assert (signals["no_conflict"], signals["replied"], signals["reply_has_time"], signals["progress"]) == (1, 1, 1, 1)

    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == episode_id]
    assert [c["call_index"] for c in calls] == list(range(len(plan.steps)))
    assert {c["harness"] for c in calls} == {"claw"}
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["status"], outcome["success"], outcome["num_model_calls"]) == ("SUCCEEDED", True, len(plan.steps))

    # the model was offered the service tools, and each tool call ran against the services in the sandbox
    requests = [body for e, body in stack["backend_log"].requests if e == episode_id]
    offered = {tool["function"]["name"] for tool in requests[0]["tools"]}
    assert {"calendar_create_event", "mail_reply", "submit"} <= offered
    results = [json.loads(m["content"]) for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert len(results) == len(reference)
    assert all(result["ok"] for result in results), results
    created = results[[c["name"] for c in reference].index("calendar_create_event")]["result"]
    assert created["id"].startswith("ev-") and created["start"] == reference[3]["arguments"]["start"]
    assert "It is now" in requests[0]["messages"][0]["content"]  # the world's time reached the system prompt
    assert stack["runtime"].list() == []
