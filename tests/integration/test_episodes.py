"""Whole episodes through the Env: scheduler → local sandbox → a real harness (the built-in agent, mini-swe-agent,
Codex CLI) → recording proxy → scripted backend, then the grader and the outcome — every call recorded token-exactly
and acknowledged before the outcome is published. Harnesses that crash or cannot start end ``CRASHED``; requests the
Env could never run are refused at submission; the host's ``PYTHON*`` variables never reach a harness."""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall, create_scripted_app
from orchard.engines.token_trace import TokenTrace, trace_of
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Episode, EpisodeState, Scheduler
from orchard.env.service import create_env_app
from orchard.env.tasks import TaskCatalog
from orchard.harnesses.base import HarnessAdapter, HarnessArtifacts, HarnessTask, ModelEndpoint, register_adapter
from orchard.prefix_delta import PromptReconstructor
from orchard.sandbox import Sandbox
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.tokens import unpack_logprobs, unpack_token_ids
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app

pytestmark = [pytest.mark.harness, pytest.mark.slow]
MODEL = "scripted-model"
HARNESSES = Path(__file__).resolve().parents[2] / ".orchard" / "harnesses"
ADMIN = "admin-secret-0123456789"  # noqa: S105 - a test token
TASK_YAML = """\
task_id: write-answer
instruction: Write the word fixed into answer.txt, then stop.
grade_command: sh "$ORCHARD_GRADER_DIR/check.sh"
harness_timeout_s: 120
"""
CHECK = 'test "$(cat answer.txt)" = fixed && echo \'{"answer_written": 1.0}\' > "$ORCHARD_GRADER_OUT/signals.json"\n'
WRITE_ANSWER = "echo fixed > answer.txt"


def tool_step(name: str, arguments: dict[str, Any], text: str = "") -> ScriptedStep:
    """A step calling one tool."""
    return ScriptedStep(text=text, tool_calls=[ScriptedToolCall(name=name, arguments=arguments)])


PLANS: dict[str, list[ScriptedStep]] = {
    "builtin": [tool_step("shell", {"command": WRITE_ANSWER}), tool_step("submit", {"summary": "wrote answer.txt"})],
    "mini-swe-agent": [
        tool_step("bash", {"command": WRITE_ANSWER}, text="Writing the file."),
        tool_step("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
    "codex": [tool_step("exec_command", {"cmd": WRITE_ANSWER}), ScriptedStep(text="Wrote answer.txt.")],
}
"""Each harness's own way to write the answer with its shell tool, then finish."""
FLAVOURS = {"builtin": "CHAT", "mini-swe-agent": "CHAT", "codex": "RESPONSES"}


def make_tasks(root: Path) -> Path:
    """One task: the workspace has a README; the grader's check lives in hidden/."""
    task = root / "write-answer"
    (task / "workspace").mkdir(parents=True)
    (task / "workspace" / "README.md").write_text("Write the answer.\n")
    (task / "hidden").mkdir()
    (task / "hidden" / "check.sh").write_text(CHECK)
    (task / "task.yaml").write_text(TASK_YAML)
    return root


@dataclass
class RequestLog:
    """An ASGI wrapper that keeps the JSON body and episode header of every request the backend receives."""

    app: Any
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        episode = dict(scope["headers"]).get(b"x-orchard-episode-id", b"").decode()
        self.requests.append((episode, json.loads(body)))
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return dict(await receive())
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def backend_traces(plan: ScriptedPlan, requests: list[tuple[str, dict[str, Any]]]) -> list[TokenTrace]:
    """What a fresh backend with the same plan answers to the same requests, in order, not streamed (a stream carries
    the same trace): the token ids and logprobs the harness was served."""

    async def replay() -> list[TokenTrace]:
        transport = httpx.ASGITransport(app=create_scripted_app(plan, policy_version=5))
        async with httpx.AsyncClient(transport=transport, base_url="http://backend") as client:
            traces = []
            for episode, body in requests:
                path = "/v1/responses" if "input" in body else "/v1/chat/completions"
                headers = {"X-Orchard-Episode-Id": episode}
                reply = await client.post(path, json={**body, "stream": False}, headers=headers)
                trace = trace_of(reply.json())
                assert trace is not None
                traces.append(trace)
            return traces

    return asyncio.run(replay())


@pytest.fixture
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Scripted backend (the plan of the harness in ``request.param``, default Codex), recording proxy on an embedded
    bus, local runtime, task catalog."""
    harness = getattr(request, "param", "codex")
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    plan = ScriptedPlan(steps=PLANS[harness], final_text="nothing left to do", model=MODEL)
    backend_log = RequestLog(create_scripted_app(plan, policy_version=5))
    backend = BackgroundServer(backend_log, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend.url}/v1", admin_token=ADMIN, run_id="run-e2e")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    # The Codex installation may sit under /tmp (a checkout there), which sandboxes see as their own empty tmpfs;
    # the runtime shares this interpreter (the built-in agent, mini-swe-agent) by itself.
    runtime = LocalRuntime(tmp_path / "sandboxes", shared_paths=[HARNESSES] if HARNESSES.is_dir() else [])
    yield {
        "harness": harness, "plan": plan, "backend_log": backend_log, "bus": bus, "proxy": proxy, "runtime": runtime,
        "tasks": TaskCatalog(make_tasks(tmp_path / "tasks")),
    }  # fmt: skip
    runtime.close()
    proxy.stop()
    backend.stop()
    bus.close()


def run_episodes(
    stack: dict[str, Any], requests: dict[str, dict[str, Any]], *, concurrency: int = 1, timeout_s: float = 240
) -> list[Episode]:
    """Submit each request (by episode id) to a scheduler on the stack and wait for all of them."""

    async def scenario() -> list[Episode]:
        admin = ProxyAdmin(stack["proxy"].url, ADMIN)
        runner = LocalEpisodeRunner(
            runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
            producer=stack["bus"].producer(), run_id="run-e2e",
        )  # fmt: skip
        scheduler = Scheduler(runner, concurrency=concurrency, timeout_s=timeout_s)
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


@pytest.mark.parametrize("stack", list(PLANS), indirect=True)
def test_a_real_harness_episode_in_a_local_sandbox_is_recorded_token_exactly_graded_and_reported(
    stack: dict[str, Any],
) -> None:
    harness, episode_id = stack["harness"], f"ep-{stack['harness']}-1"
    [episode] = run_episodes(stack, {episode_id: {"task_id": "write-answer", "harness": harness, "model": MODEL}})
    assert episode.state == EpisodeState.SUCCEEDED, (episode.error, episode.events[-3:])
    assert episode.result["signals"]["answer_written"] == 1.0

    calls = [c for c in read(stack["bus"], MODEL_CALLS) if c["episode_id"] == episode_id]
    steps = len(PLANS[harness])
    assert [c["call_index"] for c in calls] == list(range(steps))
    assert {(c["harness"], c["api_flavour"], c["policy_version"]) for c in calls} == {(harness, FLAVOURS[harness], 5)}
    # token-exact: the recorded prompt (rebuilt from its prefix delta), completion ids and logprobs are what the
    # backend served for each request it received
    served = backend_traces(stack["plan"], stack["backend_log"].requests)
    rebuilt = PromptReconstructor()
    assert len(served) == steps
    for call, trace in zip(calls, served, strict=True):
        assert np.array_equal(rebuilt.add_model_call(call), trace.prompt_token_ids)
        assert unpack_token_ids(call["completion_token_ids"]).tolist() == trace.completion_token_ids
        assert unpack_logprobs(call["completion_logprobs"]).tolist() == pytest.approx(trace.completion_logprobs)
    [outcome] = read(stack["bus"], OUTCOMES)
    assert outcome["policy_version"] == 5  # the version that served the episode's last call
    assert (outcome["episode_id"], outcome["status"], outcome["reward"], outcome["success"]) == (
        episode_id, "SUCCEEDED", 1.0, True,
    )  # fmt: skip
    assert (outcome["num_model_calls"], outcome["signals"]["answer_written"]) == (steps, 1.0)
    assert stack["runtime"].list() == []


class CommandAdapter(HarnessAdapter):
    """A harness that is only a shell command (to crash on purpose)."""

    name = "test-command"

    def __init__(self, script: str) -> None:
        self.script = script

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        return None

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        return ["/bin/sh", "-c", self.script]

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        return HarnessArtifacts(harness=self.name)


class CallThenExitAdapter(CommandAdapter):
    """A harness that makes one model call through the proxy, then exits with ``status`` (an agent that failed)."""

    name = "test-call-then-exit"

    def __init__(self, status: int) -> None:
        self.status = status

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        call = (
            "import json, os, urllib.request as u; "
            f"body = json.dumps({{'model': {endpoint.model!r}, 'messages': [{{'role': 'user', 'content': 'hi'}}]}}); "
            f"r = u.Request({endpoint.base_url + '/chat/completions'!r}, body.encode(), "
            "{'Authorization': 'Bearer ' + os.environ['KEY'], 'Content-Type': 'application/json'}); "
            "u.urlopen(r).read()"
        )
        return ["/bin/sh", "-c", f'"$0" -I -c "$1" && exit {self.status}', sys.executable, call]

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        return {"KEY": endpoint.api_key.get_secret_value()}


register_adapter("test-command", CommandAdapter)
register_adapter("test-call-then-exit", CallThenExitAdapter)
MISSING_MODULE = f"exec {sys.executable} -m no_such_harness_module"
CRASHES = {
    "killed-by-a-signal": ({"harness": "test-command", "options": {"harness": {"script": "kill -SEGV $$"}}},
                           ["killed by signal 11 (SIGSEGV), exit status 139"]),
    "not-found": ({"harness": "test-command", "options": {"harness": {"script": "exec /nonexistent/harness"}}},
                  ["could not start (not found), exit status 127"]),
    "builtin-without-its-interpreter": ({"harness": "builtin", "options": {"harness": {"python": "/no/python3"}}},
                                        ["could not start (not found), exit status 127"]),
    # exits non-zero before its first model call reaches the proxy: it never started, whatever its exit status
    "missing-module": ({"harness": "test-command", "options": {"harness": {"script": MISSING_MODULE}}},
                       ["harness test-command could not start: it exited with status 1 before its first model call",
                        "stderr: ", "No module named no_such_harness_module"]),
}  # fmt: skip


def test_a_crashing_harness_or_one_that_cannot_start_ends_crashed_and_is_never_graded(stack: dict[str, Any]) -> None:
    requests = {
        f"ep-crash-{name}": {"task_id": "write-answer", "model": MODEL, **request}
        for name, (request, _) in CRASHES.items()
    }
    episodes = run_episodes(stack, requests, concurrency=len(requests))
    assert [e.state for e in episodes] == [EpisodeState.CRASHED] * len(CRASHES)
    assert all("reward" not in e.result for e in episodes)  # the grader never ran
    outcomes = {o["episode_id"]: o for o in read(stack["bus"], OUTCOMES)}
    assert sorted(outcomes) == sorted(requests)
    for episode_id, (_, fragments) in zip(requests, CRASHES.values(), strict=True):
        outcome = outcomes[episode_id]
        assert (outcome["status"], outcome["success"], outcome["reward"], outcome["num_model_calls"]) == (
            "CRASHED", False, 0.0, 0,
        )  # fmt: skip
        assert all(fragment in (outcome["error"] or "") for fragment in fragments), outcome["error"]
    assert read(stack["bus"], MODEL_CALLS) == []
    assert stack["runtime"].list() == []


def test_an_episode_past_its_timeout_gets_a_timed_out_outcome_and_its_sandbox_removed(stack: dict[str, Any]) -> None:
    # far less than sandbox creation plus Codex start-up
    request = {"task_id": "write-answer", "harness": "codex", "model": MODEL}
    [episode] = run_episodes(stack, {"ep-slow": request}, timeout_s=0.2)
    assert episode.state == EpisodeState.TIMED_OUT
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["episode_id"], outcome["status"], outcome["success"]) == ("ep-slow", "TIMED_OUT", False)
    assert "timeout" in (outcome["error"] or "")
    assert stack["runtime"].list() == []


def test_a_hundred_concurrent_episodes_all_end_with_exactly_one_outcome(stack: dict[str, Any]) -> None:
    request = {"task_id": "write-answer", "harness": "codex", "model": MODEL}
    episodes = run_episodes(stack, {f"ep-many-{i:03d}": request for i in range(100)}, concurrency=16, timeout_s=600)
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


@pytest.mark.parametrize("stack", ["builtin"], indirect=True)
def test_an_agent_that_called_the_model_and_then_failed_is_graded(stack: dict[str, Any]) -> None:
    request = {"task_id": "write-answer", "harness": "test-call-then-exit", "model": MODEL,
               "options": {"harness": {"status": 3}}}  # fmt: skip
    [episode] = run_episodes(stack, {"ep-called-then-failed": request})
    assert (episode.state, episode.result["harness_exit_code"], episode.result["reward"]) == (
        EpisodeState.FAILED, 3, 0.0,
    )  # fmt: skip
    [outcome] = read(stack["bus"], OUTCOMES)
    assert (outcome["status"], outcome["num_model_calls"], outcome["error"]) == ("FAILED", 1, None)


BOGUS_MODULE = 'raise SystemExit("imported from a bogus checkout: " + __file__)\n'


def bogus_checkout(root: Path) -> Path:
    """A directory whose ``orchard``, ``httpx`` and ``sitecustomize`` exit at import, naming themselves."""
    (root / "orchard" / "harnesses").mkdir(parents=True)
    for module in ("orchard/__init__.py", "orchard/harnesses/__init__.py", "orchard/harnesses/builtin_agent.py",
                   "httpx.py", "sitecustomize.py", "usercustomize.py"):  # fmt: skip
        (root / module).write_text(BOGUS_MODULE)
    return root


@pytest.mark.parametrize("stack", ["builtin"], indirect=True)
def test_host_python_variables_and_a_checkout_in_the_workspace_do_not_reach_the_harness(
    stack: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Env's own environment points Python at a bogus checkout (as PYTHONPATH=<checkout> does for a dev run) ...
    checkout = bogus_checkout(tmp_path / "bogus")
    variables = {"PYTHONPATH": checkout, "PYTHONHOME": checkout, "PYTHONUSERBASE": checkout}
    for name, value in {**variables, "PYTHONSTARTUP": checkout / "httpx.py"}.items():
        monkeypatch.setenv(name, str(value))
    # ... and a task's working copy holds a package named orchard (a task on Orchard's own repository)
    shadowed = tmp_path / "tasks" / "shadowed"
    bogus_checkout(shadowed / "workspace")
    (shadowed / "hidden").mkdir()
    (shadowed / "hidden" / "check.sh").write_text(CHECK)
    (shadowed / "task.yaml").write_text(TASK_YAML.replace("write-answer", "shadowed"))
    stack["tasks"] = TaskCatalog(tmp_path / "tasks")
    requests = {f"ep-env-{task}": {"task_id": task, "harness": "builtin", "model": MODEL}
                for task in ("write-answer", "shadowed")}  # fmt: skip
    episodes = run_episodes(stack, requests, concurrency=2)
    assert [(e.state, e.result.get("reward")) for e in episodes] == [(EpisodeState.SUCCEEDED, 1.0)] * 2, [
        (e.error, e.events[-2:]) for e in episodes
    ]


def post(connection: http.client.HTTPConnection, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request on a kept-alive connection: status and JSON body."""
    headers = {"Authorization": f"Bearer {ENV_TOKEN}", "Content-Type": "application/json"}
    method = "GET" if body is None else "POST"
    connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


ENV_TOKEN = "env-token-0123456789"  # noqa: S105 - a test token


@pytest.mark.parametrize("stack", ["builtin"], indirect=True)
def test_the_env_refuses_an_unknown_task_or_harness_at_submission(stack: dict[str, Any]) -> None:
    admin = ProxyAdmin(stack["proxy"].url, ADMIN)
    runner = LocalEpisodeRunner(
        runtime=stack["runtime"], tasks=stack["tasks"], proxy=admin, proxy_url=stack["proxy"].url,
        producer=stack["bus"].producer(), run_id="run-e2e",
    )  # fmt: skip
    refused = {
        "ep-no-task": ({"task_id": "no-such-task"}, "unknown task 'no-such-task'; known: ['write-answer']"),
        "ep-no-harness": ({"harness": "no-such-harness"}, "no harness adapter 'no-such-harness'; known: "),
        "ep-bad-options": ({"options": {"harness": {"no_such_option": 1}}}, "unexpected keyword argument"),
        "ep-options-not-an-object": ({"options": {"harness": [1]}}, "options.harness must be an object"),
    }
    valid = {"task_id": "write-answer", "harness": "builtin", "model": MODEL}
    with BackgroundServer(create_env_app(Scheduler(runner, concurrency=2, timeout_s=120), ENV_TOKEN)) as env:
        connection = http.client.HTTPConnection(env.url.removeprefix("http://"), timeout=60)
        answers = {}
        for episode_id, (change, _) in refused.items():
            status, body = post(connection, "/episodes", {**valid, "episode_id": episode_id, **change})
            answers[episode_id] = (status, body["detail"])
        sock = connection.sock
        assert post(connection, "/episodes", {**valid, "episode_id": "ep-valid"})[0] == 201
        assert connection.sock is sock  # the refusals left the connection open
        deadline = time.monotonic() + 120
        while (state := post(connection, "/episodes/ep-valid")[1]["state"]) in ("QUEUED", "RUNNING"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert [e["episode_id"] for e in post(connection, "/episodes")[1]] == ["ep-valid"]
        assert all(post(connection, f"/episodes/{episode_id}")[0] == 404 for episode_id in refused)
        connection.close()
    assert {key: (status, refused[key][1] in detail) for key, (status, detail) in answers.items()} == {
        key: (422, True) for key in refused
    }, answers
    assert state == "SUCCEEDED"
    assert [o["episode_id"] for o in read(stack["bus"], OUTCOMES)] == ["ep-valid"]
