"""Real harnesses (the built-in agent, mini-swe-agent, Codex CLI) complete a small task against the scripted backend.

Each harness runs through its adapter (``prepare``, ``command``, ``collect``) with ``run_harness``, in a ``Sandbox``.
Where the local runtime has its ``root`` isolation (the runtime as root: CI), that is a ``LocalRuntime`` sandbox: its
own uid, namespaces and rlimits, this interpreter and the Codex install shared read-only, and a network that reaches
only its proxy door (which leads to the scripted backend, or to the recording proxy). Elsewhere it is
``DirectorySandbox`` below: plain subprocesses in a temporary working copy with their own ``$HOME`` and a minimal
environment. ``ORCHARD_HARNESS_SANDBOX=local`` or ``=directory`` forces one.

The plan of every test: one shell tool call ``echo fixed > answer.txt``, then the harness's own way to finish. The
assertions: the harness exited 0, the file exists, the patch adds exactly it, the backend received exactly the
expected requests with the episode's token, and the harness offered the model the tools it is known to offer.

Needs: mini-swe-agent (``pip install -e '.[dev]'``) and Codex CLI (``infra/local/install_harnesses.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall, create_scripted_app
from orchard.harnesses import HarnessTask, ModelEndpoint, get_adapter, run_harness
from orchard.harnesses.base import (
    HarnessSetupError,
    StatePath,
    collect_changes,
    read_state_file,
    read_state_file_and_changes,
    split_collected,
    write_state_file,
)
from orchard.harnesses.builtin import AGENT_SOURCE
from orchard.harnesses.codex_cli import to_toml
from orchard.sandbox import ExecResult, FileEntry, Sandbox, SandboxSpec
from producers.proxy import BackgroundServer

TOKEN = "episode-token-0123456789"  # noqa: S105 - a test token
MODEL = "orchard-policy"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTRUCTION = "Write the word fixed into a new file answer.txt, then finish."
WRITE_ANSWER = "echo fixed > answer.txt"
HARNESS_TIMEOUT_S = 60.0


# ---------------------------------------------------------------------------------------------------- backend
@dataclass
class RecordingApp:
    """An ASGI wrapper that records each HTTP request's method, path, authorization and JSON body."""

    app: Any
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        self.requests.append(
            {
                "method": scope["method"],
                "path": scope["path"],
                "authorization": headers.get("authorization"),
                "body": json.loads(body) if body else None,
            }
        )
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                message: dict[str, Any] = await receive()
                return message
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def calls(self) -> list[tuple[str, str]]:
        """(method, path) of every request, in order."""
        return [(request["method"], request["path"]) for request in self.requests]


@pytest.fixture
def scripted_backend() -> Iterator[Callable[[ScriptedPlan], tuple[str, RecordingApp]]]:
    """Start the scripted backend for a plan on a free loopback port; yields ``start(plan) -> (url, recorder)``."""
    servers: list[BackgroundServer] = []

    def start(plan: ScriptedPlan) -> tuple[str, RecordingApp]:
        recorder = RecordingApp(create_scripted_app(plan, policy_version=3))
        server = BackgroundServer(recorder, lifespan="off").start()
        servers.append(server)
        return server.url, recorder

    yield start
    for server in servers:
        server.stop()


# ---------------------------------------------------------------------------------------------------- sandbox
class DirectorySandbox(Sandbox):
    """A stand-in sandbox: subprocesses in ``root/work`` with ``HOME=root/home`` and a minimal environment.

    No isolation at all: it exists so adapter tests need neither root nor the local runtime. Swap in a runtime's
    sandbox through the ``sandbox`` fixture."""

    def __init__(self, spec: SandboxSpec, root: Path) -> None:
        self.spec = spec
        self.work, self.home = root / "work", root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        if spec.source_dir is not None:
            shutil.copytree(spec.source_dir, self.work, symlinks=True)
        else:
            self.work.mkdir(parents=True)

    def _path(self, path: str) -> Path:
        resolved = (self.work / path).resolve()
        if not resolved.is_relative_to(self.work.resolve()):
            raise ValueError(f"{path!r} escapes the working copy")
        return resolved

    def exec(
        self,
        command: Sequence[str] | str,
        *,
        timeout_s: float = 60.0,
        cwd: str = ".",
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        environment = {"PATH": SYSTEM_PATH, "HOME": str(self.home), "LANG": "C.UTF-8", "TERM": "dumb"}
        environment |= {"TMPDIR": str(self.home), **self.spec.env, **(env or {})}
        process = subprocess.Popen(
            argv,
            cwd=self._path(cwd),
            env=environment,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(stdin, timeout=timeout_s)
            code, timed_out = process.returncode, False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            code, timed_out = None, True
        text = {"stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}
        return ExecResult(exit_code=code, duration_ms=0.0, timed_out=timed_out, **text)

    def exec_stream(
        self, command: Sequence[str] | str, *, timeout_s: float = 60.0, cwd: str = "."
    ) -> Iterator[tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]]:
        result = self.exec(command, timeout_s=timeout_s, cwd=cwd)
        yield "stdout", result.stdout.encode()
        yield "stderr", result.stderr.encode()
        yield "exit", result.exit_code

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    def read_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def list_files(self, path: str = ".", recursive: bool = False) -> list[FileEntry]:
        base = self._path(path)
        found = base.rglob("*") if recursive else base.iterdir()
        return [
            FileEntry(path=str(p.relative_to(self.work)), kind="dir" if p.is_dir() else "file", size=p.stat().st_size)
            for p in sorted(found)
        ]

    def delete_file(self, path: str) -> None:
        target = self._path(path)
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    def apply_patch(self, patch: str) -> ExecResult:
        return self.exec(["git", "apply", "-"], stdin=patch.encode())

    def heartbeat(self) -> None:
        return None

    def close(self) -> None:
        shutil.rmtree(self.work.parent, ignore_errors=True)


def make_task_repo(path: Path) -> Path:
    """A one-commit git repository holding a README (the task's working copy)."""
    path.mkdir(parents=True)
    (path / "README.md").write_text("A task.\n")
    git = ["git", "-c", "user.name=orchard", "-c", "user.email=orchard@localhost", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "task"]):
        subprocess.run([*git, *args], cwd=path, check=True, capture_output=True)
    return path


SandboxFactory = Callable[[str, str], tuple[Sandbox, ModelEndpoint]]
HARNESSES = Path(__file__).resolve().parents[2] / ".orchard" / "harnesses"
"""Where ``infra/local/install_harnesses.sh`` installs Codex CLI (shared read-only with local sandboxes)."""


def sandbox_kind() -> str:
    """``local`` where the local runtime isolates as root, else ``directory`` (``ORCHARD_HARNESS_SANDBOX`` forces)."""
    forced = os.environ.get("ORCHARD_HARNESS_SANDBOX")
    if forced:
        return forced
    from orchard.sandbox.local.isolation import detect_isolation

    return "local" if detect_isolation("auto").mode == "root" else "directory"


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[SandboxFactory]:
    """``make(harness, backend_url) -> (sandbox, endpoint)``: a sandbox over a fresh task repository, and the
    backend as the sandbox reaches it (``sandbox_kind`` says which sandbox)."""
    created: list[Sandbox] = []
    runtimes: list[Any] = []

    def make(harness: str, backend_url: str) -> tuple[Sandbox, ModelEndpoint]:
        source = make_task_repo(tmp_path / f"task-{harness}")
        spec = SandboxSpec(
            sandbox_id=f"harness-{harness}",
            run_id="run-harness-tests",
            episode_id=f"episode-{harness}",
            task_id="write-answer",
            source_dir=source,
            proxy_url=backend_url,
        )
        if sandbox_kind() == "local":
            from orchard.sandbox.local.runtime import LocalRuntime

            shared = [HARNESSES] if HARNESSES.is_dir() else []
            runtime = LocalRuntime(tmp_path / "runtime", git_snapshot=True, shared_paths=shared)
            runtimes.append(runtime)
            box: Sandbox = runtime.create(spec)
            endpoint = ModelEndpoint.inside(box, api_key=TOKEN, model=MODEL)
        else:
            box = DirectorySandbox(spec, tmp_path / f"sandbox-{harness}")
            endpoint = ModelEndpoint(base_url=f"{backend_url}/v1", api_key=TOKEN, model=MODEL)
        created.append(box)
        return box, endpoint

    yield make
    for box in created:
        box.close()
    for runtime in runtimes:
        runtime.close()


# ---------------------------------------------------------------------------------------------------- cases
def shell_step(name: str, arguments: dict[str, Any], text: str = "") -> ScriptedStep:
    return ScriptedStep(text=text, tool_calls=[ScriptedToolCall(name=name, arguments=arguments)])


@dataclass(frozen=True)
class Case:
    """One harness, its plan, and what it must do with it."""

    harness: str
    plan: list[ScriptedStep]
    path: str
    tools: set[str]
    exit_status: str
    final_message: str | None
    trajectory_files: int = 1


CASES = [
    Case(
        harness="builtin",
        plan=[shell_step("shell", {"command": WRITE_ANSWER}), shell_step("submit", {"summary": "wrote answer.txt"})],
        path="/v1/chat/completions",
        tools={"shell", "submit"},
        exit_status="submitted",
        final_message="wrote answer.txt",
    ),
    Case(
        harness="mini-swe-agent",
        plan=[
            shell_step("bash", {"command": WRITE_ANSWER}, text="Writing the file."),
            shell_step("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
        ],
        path="/v1/chat/completions",
        tools={"bash"},
        exit_status="Submitted",
        final_message=None,
    ),
    Case(
        harness="codex",
        plan=[shell_step("exec_command", {"cmd": WRITE_ANSWER}), ScriptedStep(text="Wrote answer.txt.")],
        path="/v1/responses",
        tools={"exec_command"},
        exit_status="task_complete",
        final_message="Wrote answer.txt.",
    ),
]


def offered_tools(body: Mapping[str, Any]) -> set[str]:
    """Function names in a request's ``tools`` (chat: ``function.name``; responses: ``name``)."""
    return {str(tool.get("name") or tool.get("function", {}).get("name")) for tool in body.get("tools") or []}


def expected_patch(work_tree: Path) -> str:
    """The patch adding ``answer.txt`` with ``fixed``, as ``git diff --binary`` writes it."""
    blob = subprocess.run(
        ["git", "hash-object", "--stdin"], input=b"fixed\n", capture_output=True, check=True, cwd=work_tree
    )
    return (
        "diff --git a/answer.txt b/answer.txt\nnew file mode 100644\n"
        f"index {'0' * 40}..{blob.stdout.decode().strip()}\n"
        "--- /dev/null\n+++ b/answer.txt\n@@ -0,0 +1 @@\n+fixed\n"
    )


@pytest.mark.harness
@pytest.mark.parametrize("case", CASES, ids=[case.harness for case in CASES])
def test_harness_completes_task_against_scripted_backend(
    case: Case,
    scripted_backend: Callable[[ScriptedPlan], tuple[str, RecordingApp]],
    sandbox: SandboxFactory,
    tmp_path: Path,
) -> None:
    url, recorder = scripted_backend(ScriptedPlan(steps=case.plan, final_text="nothing left to do", model=MODEL))
    box, endpoint = sandbox(case.harness, url)
    adapter = get_adapter(case.harness)
    task = HarnessTask(instruction=INSTRUCTION, max_steps=5, timeout_s=HARNESS_TIMEOUT_S)

    run = run_harness(adapter, box, endpoint, task)

    diagnostics = f"stdout:\n{run.artifacts.logs['stdout'][-3000:]}\nstderr:\n{run.artifacts.logs['stderr'][-3000:]}"
    assert (run.exit_code, run.timed_out) == (0, False), diagnostics
    assert box.read_file("answer.txt") == b"fixed\n"
    assert recorder.calls() == [("POST", case.path)] * len(case.plan), diagnostics
    assert {request["authorization"] for request in recorder.requests} == {f"Bearer {TOKEN}"}
    assert {request["body"]["model"] for request in recorder.requests} == {MODEL}
    assert case.tools <= offered_tools(recorder.requests[0]["body"])
    assert (run.artifacts.exit_status, run.artifacts.final_message) == (case.exit_status, case.final_message)
    assert run.artifacts.changed_files == ["answer.txt"]
    assert run.artifacts.patch == expected_patch(tmp_path)
    assert len(run.artifacts.trajectory) == case.trajectory_files
    assert all(text for text in run.artifacts.trajectory.values())
    # adapter files live in $HOME, not in the working copy
    assert {entry.path for entry in box.list_files(".")} - {".git"} == {"README.md", "answer.txt"}


@pytest.mark.harness
def test_builtin_agent_failure_is_reported_not_hidden(
    scripted_backend: Callable[[ScriptedPlan], tuple[str, RecordingApp]], sandbox: SandboxFactory
) -> None:
    url, recorder = scripted_backend(ScriptedPlan(steps=[], model=MODEL))
    box, _ = sandbox("builtin", url)
    wrong_path = ModelEndpoint(base_url=f"{url}/no-such-api", api_key=TOKEN, model=MODEL)
    task = HarnessTask(instruction=INSTRUCTION, max_steps=3, timeout_s=HARNESS_TIMEOUT_S)

    run = run_harness(get_adapter("builtin", retries=0), box, wrong_path, task)

    assert (run.exit_code, run.artifacts.exit_status, run.artifacts.changed_files) == (1, "error", [])
    assert recorder.calls() == [("POST", "/no-such-api/chat/completions")]
    end = json.loads(next(iter(run.artifacts.trajectory.values())).splitlines()[-1])
    assert (end["event"], end["status"], end["steps"]) == ("end", "error", 1)
    assert end["error"].startswith("model API answered 404")


@pytest.mark.harness
def test_the_built_in_agents_command_collects_its_trajectory_and_patch_itself_in_its_one_exec(
    scripted_backend: Callable[[ScriptedPlan], tuple[str, RecordingApp]],
    sandbox: SandboxFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The episode's only sandboxed exec is the agent's command (each exec is a sandboxed process start); what it
    collects equals what the separate collect exec reads, and stays out of the command's logged stdout."""
    plan = [shell_step("shell", {"command": WRITE_ANSWER}), shell_step("submit", {"summary": "wrote it"})]
    url, _ = scripted_backend(ScriptedPlan(steps=plan, final_text="nothing left to do", model=MODEL))
    box, endpoint = sandbox("builtin", url)
    adapter = get_adapter("builtin")
    task = HarnessTask(instruction=INSTRUCTION, max_steps=5, timeout_s=HARNESS_TIMEOUT_S)
    commands: list[Any] = []
    real_exec = box.exec
    monkeypatch.setattr(
        box, "exec", lambda command, **options: commands.append(command) or real_exec(command, **options)
    )

    run = run_harness(adapter, box, endpoint, task)

    assert len(commands) == 1, commands
    assert (run.exit_code, run.artifacts.exit_status, run.artifacts.final_message) == (0, "submitted", "wrote it")
    separate = adapter.collect(box, task)  # the exec the command saved, run now: the same answer
    assert (run.artifacts.patch, run.artifacts.changed_files) == (separate.patch, separate.changed_files)
    assert run.artifacts.trajectory == separate.trajectory and run.artifacts.patch == expected_patch(tmp_path)
    assert "ORCHARD-" not in run.artifacts.logs["stdout"]


@pytest.mark.parametrize(
    ("stdout", "own", "collected"),
    [
        ("agent\n\0ORCHARD-COLLECT\0state\0ORCHARD-COLLECTED 0\0", "agent\n", ("state", 0)),
        # the agent printed a marker of its own first: the last one is the command's
        ("\0ORCHARD-COLLECT\0forged\0ORCHARD-COLLECTED 0\0\0ORCHARD-COLLECT\0real\0ORCHARD-COLLECTED 100\0",
         "\0ORCHARD-COLLECT\0forged\0ORCHARD-COLLECTED 0\0", ("real", 100)),
        ("agent\n\0ORCHARD-COLLECT\0sta", "agent\n\0ORCHARD-COLLECT\0sta", None),  # cut short: collect by exec
        ("agent killed at its deadline\n", "agent killed at its deadline\n", None),
    ],
)  # fmt: skip
def test_collected_output_is_split_from_the_agents_at_the_last_marker_and_only_when_it_ran_to_its_end(
    stdout: str, own: str, collected: tuple[str, int] | None
) -> None:
    head, found = split_collected(stdout, "")
    assert head == own
    assert (None if found is None else (found.stdout, found.exit_code)) == collected


def test_changes_outside_git_list_every_file(tmp_path: Path) -> None:
    spec = SandboxSpec(sandbox_id="plain", run_id="r", episode_id="e", task_id="t")
    box = DirectorySandbox(spec, tmp_path / "plain")
    box.write_file("b.txt", b"b")
    box.write_file("dir/a.txt", b"a")

    assert collect_changes(box, ".") == ("", ["b.txt", "dir/a.txt"])


class CountingSandbox(DirectorySandbox):
    """A ``DirectorySandbox`` that counts its execs (each one is a sandboxed process start in a real runtime)."""

    def __init__(self, spec: SandboxSpec, root: Path) -> None:
        super().__init__(spec, root)
        self.execs = 0

    def exec(self, command: Sequence[str] | str, **options: Any) -> ExecResult:
        self.execs += 1
        return super().exec(command, **options)


@pytest.mark.parametrize("repository", [True, False], ids=["git", "plain"])
@pytest.mark.parametrize("trajectory", ['{"event": "end"}\n', None], ids=["trajectory", "no-trajectory"])
def test_the_trajectory_and_the_changes_come_back_in_one_exec_as_they_do_in_two(
    tmp_path: Path, repository: bool, trajectory: str | None
) -> None:
    source = make_task_repo(tmp_path / "task") if repository else tmp_path / "task"
    source.mkdir(exist_ok=True)
    spec = SandboxSpec(sandbox_id="collect", run_id="r", episode_id="e", task_id="t", source_dir=source)
    box = CountingSandbox(spec, tmp_path / "box")
    box.write_file("answer.txt", b"fixed\n")
    if trajectory is not None:
        write_state_file(box, StatePath("builtin", "trajectory.jsonl"), trajectory)
    expected = (read_state_file(box, "builtin", "trajectory.jsonl"), *collect_changes(box, "."))
    box.execs = 0

    assert read_state_file_and_changes(box, "builtin", "trajectory.jsonl", ".") == expected
    assert box.execs == 1
    assert expected[0] == trajectory and expected[2] == ["answer.txt"]


def test_collecting_from_a_missing_workdir_fails_as_the_two_execs_do(tmp_path: Path) -> None:
    box = CountingSandbox(SandboxSpec(sandbox_id="c", run_id="r", episode_id="e", task_id="t"), tmp_path / "box")
    with pytest.raises(HarnessSetupError, match=r"^git diff failed in 'gone' \(103\)"):
        read_state_file_and_changes(box, "builtin", "trajectory.jsonl", "gone")


@pytest.mark.parametrize(
    ("size", "files_in_command"),
    [(100, True), (100, False), (40_000, True)],
    ids=["by-the-command", "in-one-exec", "too-long-for-an-argument"],
)
def test_the_built_in_agents_files_are_written_whole(tmp_path: Path, size: int, files_in_command: bool) -> None:
    box = CountingSandbox(SandboxSpec(sandbox_id="p", run_id="r", episode_id="e", task_id="t"), tmp_path / "box")
    instruction = ("Read -n the 'file' \"$HOME\" %s é\n" * size)[:size] + "\n\n"
    endpoint = ModelEndpoint(base_url="http://127.0.0.1:9/v1", api_key=TOKEN, model=MODEL)
    adapter = get_adapter("builtin")
    adapter.files_in_command = files_in_command  # type: ignore[misc]  # as a subclass with its own command sets it
    task = HarnessTask(instruction=instruction)

    adapter.prepare(box, endpoint, task)
    prepared = box.execs
    # the command writes them first when prepare did not (the agent fails at once against port 9: no backend)
    box.exec(adapter.command(endpoint, task), stdin=adapter.stdin(task), timeout_s=60)

    assert prepared == {(100, True): 0, (100, False): 1, (40_000, True): 2}[(size, files_in_command)]
    assert (adapter.stdin(task) == AGENT_SOURCE.read_bytes()) is (prepared == 0)
    assert (box.home / ".orchard/harness/builtin/task.md").read_text() == instruction
    assert (box.home / ".orchard/harness/builtin/builtin_agent.py").read_bytes() == AGENT_SOURCE.read_bytes()


def test_codex_config_is_valid_toml() -> None:
    adapter = get_adapter("codex", executable="codex", extra_config={"model_providers": {"orchard": {"x-y": 1.5}}})
    endpoint = ModelEndpoint(base_url="http://127.0.0.1:9/v1/", api_key=TOKEN, model='we"ird\x7fmodel')
    assert tomllib.loads(to_toml(adapter.config(endpoint))) == {
        "model": 'we"ird\x7fmodel',
        "model_provider": "orchard",
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "web_search": "disabled",
        "analytics": {"enabled": False},
        "feedback": {"enabled": False},
        "model_providers": {
            "orchard": {
                "name": "Orchard proxy",
                "base_url": "http://127.0.0.1:9/v1",
                "env_key": "ORCHARD_API_KEY",
                "wire_api": "responses",
                "x-y": 1.5,
            }
        },
    }


@pytest.mark.parametrize("module", ["base", "builtin_agent", "codex_cli"])
def test_doctests(module: str) -> None:
    import doctest
    import importlib

    results = doctest.testmod(importlib.import_module(f"orchard.harnesses.{module}"))
    assert (results.failed, results.attempted > 0) == (0, True)


# ---------------------------------------------------------------------------------------------------- through the proxy
PROXY_ADMIN = "proxy-admin-token-0123456789"  # noqa: S105 - a test token


def replay_traces(plan: ScriptedPlan, episode_id: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """What a fresh backend with the same plan answers to the same requests, in order (not streamed: a streamed
    response carries the same trace)."""
    import asyncio

    import httpx

    from orchard.engines.token_trace import trace_of

    async def replay() -> list[Any]:
        app = create_scripted_app(plan, policy_version=3)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://backend") as client:
            traces = []
            for body in bodies:
                path = "/v1/responses" if "input" in body else "/v1/chat/completions"
                reply = await client.post(
                    path, json={**body, "stream": False}, headers={"X-Orchard-Episode-Id": episode_id}
                )
                traces.append(trace_of(reply.json()))
            return traces

    return asyncio.run(replay())


@pytest.mark.parametrize("case", CASES, ids=[case.harness for case in CASES])
def test_harness_episode_through_the_proxy_is_recorded_token_exactly(
    case: Case,
    scripted_backend: Callable[[ScriptedPlan], tuple[str, RecordingApp]],
    sandbox: SandboxFactory,
    tmp_path: Path,
) -> None:
    import httpx
    import numpy as np

    from orchard.bus import open_bus
    from orchard.codec import Codec
    from orchard.config import EmbeddedBusConfig
    from orchard.prefix_delta import PromptReconstructor
    from orchard.tokens import unpack_logprobs, unpack_token_ids
    from orchard.topics import MODEL_CALLS, STANDARD_TOPICS
    from producers.proxy import ProxySettings, create_proxy_app

    plan = ScriptedPlan(steps=case.plan, final_text="nothing left to do", model=MODEL)
    backend_url, recorder = scripted_backend(plan)
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    settings = ProxySettings(backend_base_url=f"{backend_url}/v1", admin_token=PROXY_ADMIN, run_id="run-harness")
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    admin = {"Authorization": f"Bearer {PROXY_ADMIN}"}
    episode = f"episode-{case.harness}"
    try:
        opening = {"episode_id": episode, "task_id": "write-answer", "harness": case.harness, "model": MODEL}
        opened = httpx.post(f"{proxy.url}/admin/episodes", headers=admin, json={**opening, "ttl_s": 600})
        token = opened.json()["token"]
        box, _ = sandbox(case.harness, proxy.url)
        endpoint = ModelEndpoint(base_url=f"{proxy.url}/v1", api_key=token, model=MODEL)
        run = run_harness(get_adapter(case.harness), box, endpoint, HarnessTask(instruction=INSTRUCTION, max_steps=5))
        closed = httpx.delete(f"{proxy.url}/admin/episodes/{episode}", headers=admin).json()
    finally:
        proxy.stop()
    assert (run.exit_code, box.read_file("answer.txt")) == (0, b"fixed\n"), run.artifacts.logs["stderr"][-2000:]
    assert closed["calls_recorded"] == len(case.plan)

    codec, rebuilt = Codec.default(), PromptReconstructor()
    records = [codec.decode(r.value).record for r in bus.consumer([MODEL_CALLS]).poll(max_records=100, timeout_s=1)]
    bus.close()
    traces = replay_traces(plan, episode, [request["body"] for request in recorder.requests])
    assert [r["call_index"] for r in records] == list(range(len(case.plan)))
    for record, trace in zip(records, traces, strict=True):
        assert np.array_equal(rebuilt.add_model_call(record), trace.prompt_token_ids)
        assert unpack_token_ids(record["completion_token_ids"]).tolist() == trace.completion_token_ids
        assert unpack_logprobs(record["completion_logprobs"]).tolist() == pytest.approx(trace.completion_logprobs)
        assert (record["harness"], record["policy_version"]) == (case.harness, 3)
