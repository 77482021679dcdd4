"""A whole GUI episode: scheduler → local sandbox → the browser harness driving real headless Chromium (vision mode)
against the apps served inside the sandbox → recording proxy → the scripted expert, then the suite's grader on the
apps' final state. The screenshots reach the model as OpenAI image content parts; the proxy records each as a digest
reference (``producers.proxy.images``) whose bytes sit once in the object store, so the bus never carries them."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.expert import ExpertBackend
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.env.scheduler import EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.harnesses.base import register_adapter
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.store import open_store
from orchard.topics import MODEL_CALLS, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from producers.proxy.images import REF_PREFIX, ImageRecorder, referenced_digests, restore_images, store_key
from recipes.gui.harness import BrowserAgentAdapter
from recipes.gui.tasks import SuiteConfig, make_task, write_task
from tests.integration.test_episodes import ADMIN, RequestLog, read, run_episodes

pytestmark = [pytest.mark.browser, pytest.mark.harness, pytest.mark.slow]
MODEL = "gui-expert"
CHROMIUM = shutil.which("chromium")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """One shop task, the expert backend, the recording proxy on an embedded bus, the local runtime."""
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright", reason="Playwright is not installed (pip install playwright)")
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    expert = ExpertBackend(model=MODEL, policy_version=3)
    backend_log = RequestLog(expert)
    backend = BackgroundServer(backend_log, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-gui")
    store = open_store(LocalStoreConfig(path=str(tmp_path / "store")))
    proxy = BackgroundServer(create_proxy_app(settings, bus, store)).start()
    task = make_task("shop_cheapest", "train", 0, seed=0)
    write_task(task, SuiteConfig(harness_timeout_s=120), tmp_path / "tasks" / task.task_id)
    runtime = LocalRuntime(tmp_path / "sandboxes")
    register_adapter("browser", BrowserAgentAdapter)
    yield {
        "expert": expert, "backend_log": backend_log, "bus": bus, "proxy": proxy, "runtime": runtime,
        "tasks": TaskCatalog(tmp_path / "tasks"), "task": task, "root": tmp_path, "store": store,
    }  # fmt: skip
    runtime.close()
    proxy.stop()
    backend.stop()
    store.close()
    bus.close()


def expert_plan(actions: list[dict[str, Any]]) -> ScriptedPlan:
    """The reference's browser actions, one tool call per model turn."""
    steps = [ScriptedStep(tool_calls=[ScriptedToolCall(name=a["tool"], arguments=a["arguments"])]) for a in actions]
    return ScriptedPlan(steps=steps, final_text="done", model=MODEL)


def image_urls(messages: list[dict[str, Any]]) -> list[str]:
    """The URL of every image content part."""
    return [
        part["image_url"]["url"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def test_a_vision_episode_in_real_chromium_is_graded_on_app_state_and_its_screenshots_become_digests(
    stack: dict[str, Any],
) -> None:
    task, episode_id = stack["task"], "gui-vision-1"
    plan = expert_plan(task.actions)
    stack["expert"].register(episode_id, plan)
    request = {"task_id": task.task_id, "harness": "browser", "model": MODEL,
               "options": {"harness": {"mode": "vision", "chromium": CHROMIUM, "python": sys.executable}}}  # fmt: skip
    [episode] = run_episodes(stack, {episode_id: request}, timeout_s=180)
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.result, episode.events[-3:])
    signals = episode.result["signals"]
    assert (episode.result["reward"], signals["cart_exact"], signals["no_order"]) == (1.0, 1.0, 1.0)

    # the model saw the page: the a11y view names the button it clicked, and a PNG screenshot per turn
    requests = [body for e, body in stack["backend_log"].requests if e == episode_id]
    assert len(requests) == len(plan.steps)
    last = requests[-1]["messages"]
    assert f'button "{task.actions[1]["arguments"]["element"]}"' in last[1]["content"][0]["text"]
    urls = image_urls(last)
    assert len(urls) == len(plan.steps) and all(u.startswith("data:image/png;base64,") for u in urls)

    # recorded with each screenshot as a digest reference in its call's message delta, the bytes stored once
    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == episode_id]
    assert [c["call_index"] for c in calls] == list(range(len(plan.steps)))
    deltas = [json.loads(c["request_messages_json"]) for c in calls]
    recorded = [url for delta in deltas for url in image_urls(delta)]
    assert len(recorded) == len(urls) and all(url.startswith(REF_PREFIX) for url in recorded)
    assert all(len(c["request_messages_json"]) < 20_000 for c in calls)  # no screenshot bytes on the bus
    store = stack["store"]
    assert all(store.exists(store_key(digest)) for delta in deltas for digest in referenced_digests(delta))
    assert image_urls(restore_images([m for delta in deltas for m in delta], store)) == urls

    # the recorder alone: the same screenshots again store nothing new
    recorder = ImageRecorder(store)
    rewritten = recorder.rewrite(last)
    assert recorder.rewrite(last) == rewritten and len(json.dumps(rewritten)) < len(json.dumps(last)) // 10
    assert restore_images(rewritten, store) == last
