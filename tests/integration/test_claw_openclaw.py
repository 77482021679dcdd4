"""OpenClaw on a Claw task: the real ``openclaw agent exec`` (npm ``openclaw``, Node 24) headless in a local sandbox,
with the recording proxy as its model provider and the Claw MCP server as its tools, driven by the scripted expert
replaying the task's reference solution through OpenClaw's ``tool_call``; graded SUCCEEDED on the services' state.

Skipped unless OpenClaw is installed under ``$ORCHARD_OPENCLAW_PREFIX`` or ``.orchard/harnesses/openclaw``
(``recipes/claw/openclaw.py`` says how); it takes about 20 s, most of it OpenClaw's start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.engines.expert import ExpertBackend
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.env.scheduler import EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.topics import MODEL_CALLS, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.claw.expert import MODEL
from recipes.claw.openclaw import default_prefix, installation, openclaw_tool_call, register
from recipes.claw.tasks import ClawConfig, generate, load_solutions
from tests.integration.test_episodes import ADMIN, RequestLog, read, run_episodes

PREFIX = default_prefix()
pytestmark = [
    pytest.mark.harness,
    pytest.mark.slow,
    pytest.mark.skipif(
        not all(path.is_file() for path in installation(PREFIX)), reason=f"OpenClaw is not installed under {PREFIX}"
    ),
]
TASK_ID = "claw-train-save-report-000"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Claw tasks whose sandboxes allow Node's address space, the expert backend, the proxy, a local runtime that
    shares the OpenClaw installation, and the ``openclaw`` harness registered."""
    register()
    generate(ClawConfig(train_per_kind=1, eval_per_kind=1, memory_mb=8192), tmp_path / "tasks")
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    expert = ExpertBackend(model=MODEL)
    backend_log = RequestLog(expert)
    backend = BackgroundServer(backend_log, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-openclaw")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    runtime = LocalRuntime(tmp_path / "sandboxes", hidden_paths=[tmp_path / "tasks"], shared_paths=[PREFIX])
    yield {
        "expert": expert, "backend_log": backend_log, "bus": bus, "proxy": proxy, "runtime": runtime,
        "tasks": TaskCatalog(tmp_path / "tasks" / "train"), "out": tmp_path / "tasks",
    }  # fmt: skip
    runtime.close()
    proxy.stop()
    backend.stop()
    bus.close()


def test_openclaw_runs_headless_through_the_proxy_with_the_claw_mcp_tools_and_solves_the_task(
    stack: dict[str, Any],
) -> None:
    reference = load_solutions(stack["out"], "train", TASK_ID)["reference"]
    steps = [
        ScriptedStep(tool_calls=[ScriptedToolCall(**openclaw_tool_call(c["name"], c["arguments"]))]) for c in reference
    ]
    plan = ScriptedPlan(steps=[*steps, ScriptedStep(text="Saved, added the task, archived.")], model=MODEL)
    stack["expert"].register("openclaw-1", plan)
    request = {
        "task_id": TASK_ID,
        "harness": "openclaw",
        "model": MODEL,
        "options": {"harness": {"prefix": str(PREFIX)}},
    }
    [episode] = run_episodes(stack, {"openclaw-1": request}, timeout_s=300)
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.result, episode.events[-3:])
    assert (episode.result["signals"]["archived"], episode.result["signals"]["progress"]) == (1.0, 1.0)

    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == "openclaw-1"]
    assert sorted(c["call_index"] for c in calls) == list(range(len(plan.steps)))
    assert {(c["harness"], c["api_flavour"]) for c in calls} == {("openclaw", "CHAT")}
    requests = [body for e, body in stack["backend_log"].requests if e == "openclaw-1"]
    assert "tool_call" in {tool["function"]["name"] for tool in requests[0]["tools"]}
    last = " ".join(str(m.get("content")) for m in requests[-1]["messages"] if m["role"] == "tool")
    assert '"folder": "archive"' in last  # the services' answer to the last tool call reached the model
