"""Whole SWE episodes on a task of the local suite: scheduler → local sandbox → a real harness (the built-in agent,
mini-swe-agent, Codex CLI) → recording proxy → the scripted SWE expert, then the suite's grader running the hidden
tests — every call recorded token-exactly, the outcome on the bus. The expert that applies the reference fix
resolves the task; one that only explores does not."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchard.bus import open_bus
from orchard.cli.serve import sandbox_hidden_paths
from orchard.config import EmbeddedBusConfig, OrchardConfig
from orchard.engines.expert import ExpertBackend
from orchard.engines.scripted import ScriptedPlan
from orchard.env.scheduler import EpisodeState
from orchard.env.tasks import TaskCatalog
from orchard.prefix_delta import PromptReconstructor
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.tokens import unpack_logprobs, unpack_token_ids
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.swe.build import SUITE_DIR, BuildConfig, write_task
from recipes.swe.expert import DIALECTS, MODEL, Dialect, dialect_steps, expert_episode_id, expert_plan
from tests.integration.test_episodes import (
    ADMIN,
    FLAVOURS,
    HARNESSES,
    RequestLog,
    backend_traces,
    read,
    run_episodes,
)

pytestmark = [pytest.mark.harness, pytest.mark.slow]
INSTANCE = SUITE_DIR / "retry-001"
"""A small train instance: one module changed by the fix, a visible test file, hidden tests of the schedule."""
POLICY_VERSION = 5  # what ``backend_traces`` replays with


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The suite task built (grading with this interpreter, which has pytest), the expert backend (plans registered
    per episode by the test), the recording proxy on an embedded bus, the local runtime."""
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    expert = ExpertBackend(model=MODEL, policy_version=POLICY_VERSION)
    backend_log = RequestLog(expert)
    backend = BackgroundServer(backend_log, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-e2e")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    config = BuildConfig(python=sys.executable, harness_timeout_s=120, grade_timeout_s=120)
    instance = write_task(INSTANCE, tmp_path / "tasks" / INSTANCE.name, config)
    # what `orchard env serve --tasks TASKS --hide SUITE` hides from its sandboxes
    orchard_config = OrchardConfig(
        bus=EmbeddedBusConfig(path=tmp_path / "bus"), store={"type": "local", "path": str(tmp_path / "store")}
    )
    hidden = sandbox_hidden_paths(orchard_config, tmp_path / "tasks", [SUITE_DIR])
    shared = [HARNESSES] if HARNESSES.is_dir() else []
    runtime = LocalRuntime(tmp_path / "sandboxes", hidden_paths=hidden, shared_paths=shared)
    yield {
        "expert": expert, "backend_log": backend_log, "bus": bus, "proxy": proxy, "runtime": runtime,
        "tasks": TaskCatalog(tmp_path / "tasks"), "instance": instance, "root": tmp_path,
    }  # fmt: skip
    runtime.close()
    proxy.stop()
    backend.stop()
    bus.close()


def run_expert(stack: dict[str, Any], harness: Dialect, *, apply_fix: bool) -> tuple[str, Any, Any]:
    """One episode of ``harness`` on the suite task with the expert's plan; returns its id, plan and episode."""
    episode_id = expert_episode_id(INSTANCE.name, harness) + ("" if apply_fix else "-nofix")
    plan = expert_plan(INSTANCE, harness, python=sys.executable, apply_fix=apply_fix)
    stack["expert"].register(episode_id, plan)
    request = {"task_id": INSTANCE.name, "harness": harness, "model": MODEL}
    [episode] = run_episodes(stack, {episode_id: request}, timeout_s=180)
    return episode_id, plan, episode


def assert_recorded_as_served(stack: dict[str, Any], harness: str, episode_id: str, plan: Any) -> str:
    """Every model call of the episode is on the bus, in order, token-exactly what the backend served; returns the
    last request the model got (JSON), which holds what the commands printed."""
    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == episode_id]
    steps = len(plan.steps)
    assert [c["call_index"] for c in calls] == list(range(steps))
    assert {(c["harness"], c["api_flavour"], c["policy_version"]) for c in calls} == {
        (harness, FLAVOURS[harness], POLICY_VERSION)
    }
    requests = [(e, body) for e, body in stack["backend_log"].requests if e == episode_id]
    served = backend_traces(plan, requests)
    assert len(served) == steps
    rebuilt = PromptReconstructor()
    for call, trace in zip(calls, served, strict=True):
        assert np.array_equal(rebuilt.add_model_call(call), trace.prompt_token_ids)
        assert unpack_token_ids(call["completion_token_ids"]).tolist() == trace.completion_token_ids
        assert unpack_logprobs(call["completion_logprobs"]).tolist() == pytest.approx(trace.completion_logprobs)
    return json.dumps(requests[-1][1])


@pytest.mark.parametrize("harness", DIALECTS)
def test_the_expert_fixes_a_suite_task_through_a_real_harness_and_the_grader_resolves_it(
    stack: dict[str, Any], harness: Dialect
) -> None:
    episode_id, plan, episode = run_expert(stack, harness, apply_fix=True)
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.result, episode.events[-3:])
    signals = episode.result["signals"]
    assert (episode.result["reward"], signals["f2p_fraction"], signals["p2p_fraction"]) == (1.0, 1.0, 1.0)
    assert (signals["test_patch_applied"], signals["touched_reference_files"], signals["wrote_tests"]) == (1, 1, 0)

    seen = assert_recorded_as_served(stack, harness, episode_id, plan)
    # the commands really ran in the sandbox: the model read the buggy line, and the visible tests passed twice
    assert "factor ** (i + 1)" in seen and seen.count("3 passed") == 2, seen[-3000:]
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["reward"], outcome["success"]) == (
        episode_id, "SUCCEEDED", 1.0, True,
    )  # fmt: skip
    assert (outcome["num_model_calls"], outcome["signals"]["f2p_fraction"]) == (len(plan.steps), 1.0)
    assert stack["runtime"].list() == []


def test_an_expert_that_only_explores_fails_the_hidden_tests(stack: dict[str, Any]) -> None:
    episode_id, plan, episode = run_expert(stack, "builtin", apply_fix=False)
    assert episode.state == EpisodeState.FAILED, (episode.error, episode.result, episode.events[-3:])
    signals = episode.result["signals"]
    assert (episode.result["reward"], signals["f2p_fraction"], signals["p2p_fraction"]) == (0.0, 0.0, 1.0)
    assert (signals["files_changed"], signals["resolved"]) == (0, 0)

    seen = assert_recorded_as_served(stack, "builtin", episode_id, plan)
    assert seen.count("3 passed") == 1, seen[-3000:]  # the visible tests pass at base: they do not show the bug
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["reward"], outcome["success"]) == (
        episode_id, "FAILED", 0.0, False,
    )  # fmt: skip
    assert outcome["signals"]["f2p_fraction"] == 0.0
    assert stack["runtime"].list() == []


def test_an_agent_searching_the_filesystem_and_git_history_finds_neither_the_hidden_tests_nor_the_fix(
    stack: dict[str, Any],
) -> None:
    root: Path = stack["root"]
    task_dir, suite_dir = root / "tasks" / INSTANCE.name, SUITE_DIR / INSTANCE.name
    repo = SUITE_DIR.parents[2]  # the checkout: its history holds the suite too
    # the secrets, read from where they live (this file does not spell them): a hidden test's name, the fixed line
    hidden_test = str(stack["instance"].FAIL_TO_PASS[0]).rsplit("::", 1)[1]
    fixed_line = next(line.strip() for line in (suite_dir / "fix" / "retry" / "policy.py").read_text().splitlines()
                      if "factor" in line and "delay =" in line)  # fmt: skip
    assert hidden_test in (task_dir / "hidden" / "instance.json").read_text()
    # grep patterns that match the secrets without spelling them: only what a command finds can contain them
    patterns = f"-e '{hidden_test[:-1]}[{hidden_test[-1]}]' -e '{fixed_line[:-1]}[{fixed_line[-1]}]'"
    patterns = patterns.replace("*", "[*]")
    snoop = [
        # other runs' directories on this machine are not this Env's to hide (README: pass --hide for them)
        f"grep -rIho {patterns} {root} {repo} /tmp /home . --exclude-dir=.venv --exclude-dir=runs "
        "--exclude-dir=.orchard 2>/dev/null | head; echo searched",
        f"ls -la {task_dir} {suite_dir} 2>&1; cat {task_dir}/hidden/instance.json 2>&1",
        f"cat {suite_dir}/fix/retry/policy.py {suite_dir}/hidden_tests/tests/*.py 2>&1",
        f"git log --all -p | grep -o {patterns}; git fsck --lost-found 2>&1 | head; git rev-list --count --all; "
        "echo own-history-done",
        f"git -c safe.directory='*' -C {repo} log --all -p 2>&1 | grep -o {patterns} | head -3; "
        f"git -c safe.directory='*' -C {repo} grep -o {patterns} HEAD 2>&1 | head -3; echo repo-history-done",
    ]
    episode_id = "snoop-" + INSTANCE.name
    plan = ScriptedPlan(steps=dialect_steps(snoop, "builtin"), final_text="done", model=MODEL)
    stack["expert"].register(episode_id, plan)
    request = {"task_id": INSTANCE.name, "harness": "builtin", "model": MODEL}
    [episode] = run_episodes(stack, {episode_id: request}, timeout_s=240)
    assert episode.state == EpisodeState.FAILED, (episode.error, episode.result)

    last = [body for e, body in stack["backend_log"].requests if e == episode_id][-1]
    outputs = [json.loads(str(m["content"]))["output"] for m in last["messages"] if m["role"] == "tool"]
    searched, listed, read, own_history, repo_history = outputs
    assert searched == "searched\n", searched  # grep -o prints every match found, and there are none
    assert listed.count("No such file or directory") >= 2 and read.count("No such file or directory") >= 2
    assert own_history.endswith("1\nown-history-done\n"), own_history  # the snapshot: one commit, no fix in it
    assert "not a git repository" in repo_history or repo_history == "repo-history-done\n", repo_history
    everything = "\n".join(outputs)
    assert hidden_test not in everything and fixed_line not in everything, everything[-4000:]
