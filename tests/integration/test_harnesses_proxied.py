"""The npm coding harnesses Orchard was not built around: Claude Code (Anthropic Messages), opencode (chat
completions) and pi, each through the recording proxy to the scripted backend.

Each runs through its adapter in the sandbox of ``test_harnesses`` (a ``LocalRuntime`` sandbox where the runtime is
root, else the stand-in) with ``infra/local/install_harnesses.sh``'s install. The proxy records every call (Claude
Code's ``POST /v1/messages?beta=true`` translated into a chat completions call for the backend) and the plans call
each harness's own tools, then end with a reply without tool calls.

- a small task: the calls the harness made (path, query, credential), what the proxy received and recorded (token for
  token what the backend served), how it ended in its own words, its trajectory, the patch;
- an API failure (a refused token) and the turn limit, read from the harness's output, not its exit status;
- a graded SWE episode through the Env: the scripted expert lists the files, reads the buggy module with the
  harness's read tool, writes the reference fix with its shell tool, runs the visible tests, stops; the suite's
  grader resolves it.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.env.episode_runner import CALL_COUNTS
from orchard.env.scheduler import EpisodeState
from orchard.harnesses import HarnessRun, HarnessTask, ModelEndpoint, get_adapter, register_adapter, run_harness
from orchard.harnesses.claude_code import ClaudeCodeAdapter
from orchard.harnesses.opencode import OpencodeAdapter
from orchard.harnesses.pi import PiAdapter
from orchard.prefix_delta import PromptReconstructor
from orchard.sandbox import Sandbox
from orchard.tokens import unpack_logprobs, unpack_token_ids
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.swe.expert import MODEL as EXPERT_MODEL
from recipes.swe.expert import expert_commands, expert_episode_id
from tests.integration.test_episodes import backend_traces, read, run_episodes
from tests.integration.test_harnesses import (
    INSTRUCTION,
    MODEL,
    PROXY_ADMIN,
    WRITE_ANSWER,
    RecordingApp,
    SandboxFactory,
    expected_patch,
    offered_tools,
    replay_traces,
    sandbox,  # noqa: F401 - a fixture
    scripted_backend,  # noqa: F401 - a fixture
)
from tests.integration.test_swe_episodes import INSTANCE, POLICY_VERSION, stack  # noqa: F401 - stack: a fixture

pytestmark = [pytest.mark.harness]
CLAUDE, OPENCODE, PI = "claude-code", "opencode", "pi"
for _name, _factory in {CLAUDE: ClaudeCodeAdapter, OPENCODE: OpencodeAdapter, PI: PiAdapter}.items():
    register_adapter(_name, _factory)  # idempotent: the same factories as the built-in registrations
EPISODE = "episode-proxied"


def tool(name: str, **arguments: Any) -> ScriptedStep:
    """A step calling one of the harness's tools."""
    return ScriptedStep(tool_calls=[ScriptedToolCall(name=name, arguments=arguments)])


# ---------------------------------------------------------------------------------------------------- dialects
def shell_call(harness: str, command: str) -> ScriptedStep:
    """A step running ``command`` with the harness's shell tool."""
    if harness == CLAUDE:
        return tool("Bash", command=command)
    if harness == PI:
        return tool("bash", command=command)
    return tool("bash", command=command, description="Run a command")


def read_call(harness: str, path: str) -> ScriptedStep:
    """A step reading ``path`` (relative to the working directory) with the harness's read tool."""
    arguments = {CLAUDE: {"file_path": path}, OPENCODE: {"filePath": path}, PI: {"path": path}}[harness]
    return tool("Read" if harness == CLAUDE else "read", **arguments)


def dialect_steps(harness: str, commands: list[str], summary: str) -> list[ScriptedStep]:
    """Shell commands in the harness's dialect: ``cat FILE`` as its read tool, the others as its shell tool, then a
    final reply without tool calls (which ends each of these harnesses' headless runs)."""
    steps = []
    for command in commands:
        words = shlex.split(command) if "<<" not in command else []
        is_read = len(words) == 2 and words[0] == "cat"
        steps.append(read_call(harness, words[1]) if is_read else shell_call(harness, command))
    return [*steps, ScriptedStep(text=summary)]


@dataclass(frozen=True)
class Case:
    """A harness and what it is known to do through the proxy."""

    harness: str
    request: tuple[str, str, str, str]
    """(method, path, query, credential) of each of its model calls as the proxy sees them."""
    harness_api: str
    tools: set[str]
    done: str
    """Its ``exit_status`` when the model answers without tool calls."""
    api_error: str
    """Its ``exit_status`` when the proxy refuses the token."""
    trajectory_files: int = 2
    """The events and the session transcript (opencode keeps its sessions in SQLite)."""
    conversations: int = 1
    """Conversations the proxy sees in the two-call task (more: the harness changed a sampled turn)."""


CASES = [
    Case(CLAUDE, ("POST", "/v1/messages", "beta=true", "bearer"), "MESSAGES", {"Bash", "Read", "Edit", "Write"},
         "success", "error"),
    # opencode and pi re-send the tool call's spaced JSON arguments as compact JSON; the proxy forwards the turn as
    # sampled (producers.proxy.canonical), so the second prompt extends the first call's tokens: one conversation
    Case(OPENCODE, ("POST", "/v1/chat/completions", "", "bearer"), "CHAT", {"bash", "read", "edit", "write"},
         "stop", "APIError", trajectory_files=1),
    Case(PI, ("POST", "/v1/chat/completions", "", "bearer"), "CHAT", {"bash", "read", "edit", "write"},
         "stop", "error"),
]  # fmt: skip
CASE = {case.harness: case for case in CASES}


# ---------------------------------------------------------------------------------------------------- through the proxy
@dataclass
class ProxyLog:
    """An ASGI wrapper of the proxy keeping each harness request's method, path, query and kind of credential."""

    app: Any
    requests: list[tuple[str, str, str, str]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "http" and not scope["path"].startswith("/admin"):
            headers = dict(scope["headers"])
            bearer = headers.get(b"authorization", b"").startswith(b"Bearer ")
            credential = "bearer" if bearer else "x-api-key" if b"x-api-key" in headers else "none"
            self.requests.append((scope["method"], scope["path"], scope["query_string"].decode(), credential))
        await self.app(scope, receive, send)


@dataclass
class ProxiedRun:
    """A harness run through the proxy: the run, the episode's summary, the records, what each side saw."""

    run: HarnessRun
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    backend: RecordingApp
    proxy: ProxyLog
    sandbox: Sandbox


@pytest.fixture
def through_proxy(
    scripted_backend: Callable[[ScriptedPlan], tuple[str, RecordingApp]],  # noqa: F811 - the fixture
    sandbox: SandboxFactory,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> Callable[..., ProxiedRun]:
    """``run(harness, plan, max_steps=5, token=None, **options)``: the harness (its adapter built with ``options``)
    in a sandbox through a recording proxy to the scripted backend; ``token`` replaces the episode's own."""

    def run(harness: str, plan: ScriptedPlan, max_steps: int = 5, token: str | None = None, **options: Any) -> Any:
        backend_url, recorder = scripted_backend(plan)
        bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
        for spec in STANDARD_TOPICS:
            bus.create_topic(spec.name, spec.partitions, exist_ok=True)
        settings = ProxySettings(backend_base_url=f"{backend_url}/v1", admin_token=PROXY_ADMIN, run_id="run-proxied")
        proxy_log = ProxyLog(create_proxy_app(settings, bus))
        proxy = BackgroundServer(proxy_log).start()
        admin = {"Authorization": f"Bearer {PROXY_ADMIN}"}
        opening = {"episode_id": EPISODE, "task_id": "t", "harness": harness, "model": MODEL, "ttl_s": 600}
        try:
            granted = httpx.post(f"{proxy.url}/admin/episodes", headers=admin, json=opening).json()["token"]
            box, _ = sandbox(harness, proxy.url)
            endpoint = ModelEndpoint(base_url=f"{proxy.url}/v1", api_key=token or granted, model=MODEL)
            task = HarnessTask(instruction=INSTRUCTION, max_steps=max_steps, timeout_s=120)
            harness_run = run_harness(get_adapter(harness, **options), box, endpoint, task)
            summary = httpx.delete(f"{proxy.url}/admin/episodes/{EPISODE}", headers=admin).json()
        finally:
            proxy.stop()
        codec = Codec.default()
        records = [codec.decode(r.value).record for r in bus.consumer([MODEL_CALLS]).poll(max_records=100, timeout_s=1)]
        bus.close()
        return ProxiedRun(harness_run, summary, records, recorder, proxy_log, box)

    return run


def diagnostics(run: HarnessRun) -> str:
    """The ends of the run's logs and trajectory, for assertion messages."""
    trajectory = "\n".join(f"{key}:\n{text[-3000:]}" for key, text in run.artifacts.trajectory.items())
    return f"stderr:\n{run.artifacts.logs.get('stderr', '')[-2000:]}\ntrajectory:\n{trajectory}"


def all_recorded(calls: int) -> dict[str, int]:
    """The call counts of an episode whose ``calls`` were all recorded (the outcome's ``model_call_counts``)."""
    return {"received": calls, **dict.fromkeys(CALL_COUNTS, 0), "recorded": calls}


def assert_recorded_token_exactly(done: ProxiedRun, plan: ScriptedPlan, harness_api: str) -> None:
    """Every call is a record, in order, holding the tokens and logprobs the backend served for it."""
    traces = replay_traces(plan, EPISODE, [request["body"] for request in done.backend.requests])
    rebuilt = PromptReconstructor()
    assert [r["call_index"] for r in done.records] == list(range(len(traces)))
    for record, trace in zip(done.records, traces, strict=True):
        assert (record["api_flavour"], record["harness_api"]) == ("CHAT", harness_api)
        assert np.array_equal(rebuilt.add_model_call(record), trace.prompt_token_ids)
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == trace.completion_token_ids
        assert unpack_logprobs(record["completion_logprobs"]).tolist() == pytest.approx(trace.completion_logprobs)


@pytest.mark.parametrize("case", CASES, ids=[case.harness for case in CASES])
def test_a_harness_completes_a_task_through_the_proxy_recorded_token_exactly(
    case: Case, through_proxy: Callable[..., ProxiedRun], tmp_path: Path
) -> None:
    steps = [shell_call(case.harness, WRITE_ANSWER), ScriptedStep(text="Wrote answer.txt.")]
    plan = ScriptedPlan(steps=steps, model=MODEL)
    done = through_proxy(case.harness, plan)
    run = done.run

    assert (run.exit_code, run.timed_out) == (0, False), diagnostics(run)
    assert (run.artifacts.exit_status, run.artifacts.final_message) == (case.done, "Wrote answer.txt.")
    assert (run.artifacts.changed_files, run.artifacts.patch) == (["answer.txt"], expected_patch(tmp_path))
    # the harness's own API and credential; the backend got chat completions, streamed, the same tools each call
    assert done.proxy.requests == [case.request] * len(steps)
    assert done.backend.calls() == [("POST", "/v1/chat/completions")] * len(steps)
    bodies = [request["body"] for request in done.backend.requests]
    assert {(body["model"], body["stream"]) for body in bodies} == {(MODEL, True)}
    assert case.tools <= offered_tools(bodies[0]) and all(b["tools"] == bodies[0]["tools"] for b in bodies)
    assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]  # no system turn among the messages
    assert INSTRUCTION in json.dumps(bodies[0]["messages"][-1])
    # every call received was recorded, token for token what the backend served
    counts = {name: done.summary[f"calls_{name}"] for name in ("received", *CALL_COUNTS)}
    assert (counts, done.summary["conversations"]) == (all_recorded(len(steps)), case.conversations)
    assert_recorded_token_exactly(done, plan, case.harness_api)
    assert {r["harness"] for r in done.records} == {case.harness}
    # its own trajectory: the events it printed (and its session file, where it writes one), outside the working copy
    assert f"~/.orchard/harness/{case.harness}/events.jsonl" in run.artifacts.trajectory
    assert len(run.artifacts.trajectory) == case.trajectory_files and all(run.artifacts.trajectory.values())


@pytest.mark.parametrize("case", CASES, ids=[case.harness for case in CASES])
def test_an_api_failure_is_read_from_the_harness_output(case: Case, through_proxy: Callable[..., ProxiedRun]) -> None:
    plan = ScriptedPlan(steps=[ScriptedStep(text="never sent")], model=MODEL)
    wrong = "not-the-episode-token-0123"  # noqa: S105 - a wrong token on purpose
    retries = {"max_retries": 1} if case.harness == CLAUDE else {}  # Claude Code retries a 401 10 times by default
    done = through_proxy(case.harness, plan, token=wrong, **retries)
    run = done.run

    assert run.artifacts.exit_status == case.api_error, diagnostics(run)
    assert (done.backend.requests, done.records, done.summary["calls_received"]) == ([], [], 0)
    assert done.proxy.requests and set(done.proxy.requests) == {case.request}


LIMITS = [
    # Claude Code stops after --max-turns calls and says so
    (CASE[CLAUDE], "error_max_turns", 2, b"0\n1\n"),
    # opencode's limit is a request: from the last step on it asks for text only, but runs the tool calls it gets
    # until the model answers without any (here the plan's four calls, then its final text)
    (CASE[OPENCODE], "stop", 5, b"0\n1\n2\n3\n"),
    # pi has none
    (CASE[PI], "stop", 5, b"0\n1\n2\n3\n"),
]


@pytest.mark.parametrize(("case", "status", "calls", "written"), LIMITS, ids=[limit[0].harness for limit in LIMITS])
def test_the_step_limit_is_the_harness_own(
    case: Case, status: str, calls: int, written: bytes, through_proxy: Callable[..., ProxiedRun]
) -> None:
    steps = [shell_call(case.harness, f"echo {n} >> answer.txt") for n in range(4)]
    done = through_proxy(case.harness, ScriptedPlan(steps=steps, model=MODEL), max_steps=2)

    assert done.run.artifacts.exit_status == status, diagnostics(done.run)
    assert (done.summary["calls_received"], done.summary["calls_recorded"], len(done.records)) == (calls,) * 3
    assert done.sandbox.read_file("answer.txt") == written
    if case.harness == OPENCODE:
        last_messages = [str(r["body"]["messages"][-1]["content"]) for r in done.backend.requests]
        assert ["MAXIMUM STEPS REACHED" in text for text in last_messages] == [False] + [True] * (calls - 1)


# ---------------------------------------------------------------------------------------------------- a SWE episode
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.harness for case in CASES])
def test_a_harness_resolves_a_suite_task_through_the_env_and_the_grader(
    case: Case,
    stack: dict[str, Any],  # noqa: F811 - the fixture
) -> None:
    episode_id = expert_episode_id(INSTANCE.name, case.harness)
    commands = expert_commands(INSTANCE, python=sys.executable)
    plan = ScriptedPlan(steps=dialect_steps(case.harness, commands, "Fixed the retry delay."), model=EXPERT_MODEL)
    stack["expert"].register(episode_id, plan)

    request = {"task_id": INSTANCE.name, "harness": case.harness, "model": EXPERT_MODEL}
    [episode] = run_episodes(stack, {episode_id: request}, timeout_s=240)

    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.result, episode.events[-3:])
    signals = episode.result["signals"]
    assert (episode.result["reward"], signals["f2p_fraction"], signals["p2p_fraction"]) == (1.0, 1.0, 1.0)
    assert (signals["test_patch_applied"], signals["touched_reference_files"], episode.result["harness_exit_code"]) == (
        1, 1, 0,
    )  # fmt: skip
    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == episode_id]
    steps = len(plan.steps)
    assert [c["call_index"] for c in calls] == list(range(steps))
    assert {(c["harness"], c["api_flavour"], c["harness_api"], c["policy_version"]) for c in calls} == {
        (case.harness, "CHAT", case.harness_api, POLICY_VERSION)
    }
    requests = [(e, body) for e, body in stack["backend_log"].requests if e == episode_id]
    served = backend_traces(plan, requests)
    rebuilt = PromptReconstructor()
    for call, trace in zip(calls, served, strict=True):
        assert np.array_equal(rebuilt.add_model_call(call), trace.prompt_token_ids)
        assert unpack_token_ids(call["completion_token_ids"]).tolist() == trace.completion_token_ids
    # the tools really ran in the sandbox: the read showed the buggy line, the visible tests passed before and after
    seen = json.dumps(requests[-1][1])
    assert "factor ** (i + 1)" in seen and seen.count("3 passed") == 2, seen[-3000:]
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["reward"], outcome["num_model_calls"]) == (
        episode_id, "SUCCEEDED", 1.0, steps,
    )  # fmt: skip
    assert outcome["model_call_counts"] == all_recorded(steps)
    assert stack["runtime"].list() == []
