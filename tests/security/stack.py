"""The red team's stack and referee: real episodes through the Env's episode runner, the local runtime as root, the
recording proxy on an embedded bus in front of a scripted engine, the sandbox API beside them, the recipes' own tasks
(a file-lookup task from its generator, a SWE task from the suite's builder) with small limits; then the verdict.

Everything the Env owns lives outside ``/tmp`` (``/var/lib/orchard-redteam-env-*``), as a real run's directory
does, and is hidden from sandboxes the way ``orchard env serve --hide SUITE`` hides it: bus, store, task
directories, the suite and the checkout's history. The runtime is wrapped (``SpyRuntime``) only to keep what each
sandbox printed before grading; the adapter snapshots its working copy and home (``harness.SNAPSHOTS``).

A verdict lists every breach of an episode: reward or success it did not earn, signals it did not earn, a secret in
anything the sandbox could send out (its output, working copy, home, model calls), a breach the attack observed
itself, and any change to the host: canaries touched, processes of the sandbox's uid left, files of that uid outside
the sandbox, kernel keys of that uid, the sandbox's directory left, disk not given back.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchard.bus import Bus, Producer, open_bus
from orchard.cli.serve import sandbox_hidden_paths
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, OrchardConfig
from orchard.engines.expert import ExpertBackend
from orchard.engines.scripted import ScriptedPlan
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Episode, EpisodeState, Scheduler
from orchard.env.tasks import TaskCatalog
from orchard.http_server import BackgroundServer
from orchard.sandbox import Sandbox, SandboxSpec
from orchard.sandbox.api import create_sandbox_app
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.topics import OUTCOMES, STANDARD_TOPICS
from producers.proxy import ProxySettings, create_proxy_app
from recipes.file_lookup.generate import LookupConfig, LookupTask, generate
from recipes.swe.build import SUITE_DIR, BuildConfig, write_task
from tests.integration.test_episodes import RequestLog
from tests.security import host
from tests.security.attack import Attack, TaskKind, render
from tests.security.harness import NAME, RAN_MARKER, SNAPSHOTS, Snapshot

MODEL = "redteam-model"
RUN_ID = "run-redteam"
REPO = Path(__file__).resolve().parents[2]
INSTANCE = SUITE_DIR / "retry-001"
FIX_RELPATH = "recipes/swe/suite/retry-001/fix/retry/policy.py"
HIDDEN_TEST_FILE = "tests/test_hidden_schedule.py"
LIMITS = {"cpu_seconds": 60, "cpus": 1.0, "memory_mb": 768, "processes": 64, "file_size_mb": 16, "disk_mb": 32,
          "open_files": 256}  # fmt: skip
EPISODE_TIMEOUT_S = 180.0
UNEARNED_SIGNALS: dict[TaskKind, tuple[str, ...]] = {
    "lookup": ("answer_correct", "right_file", "progress"),
    "swe": ("resolved", "f2p_fraction"),
}
"""Signals an attack that solves nothing must leave at 0."""
VICTIM_PORT = 47001
VICTIM = """\
import os, socket, threading, time
CANARY = "@@VICTIM_CANARY@@"
for path in ("victim.txt", os.path.expanduser("~/victim.txt"), "/tmp/victim.txt", "/dev/shm/victim.txt"):
    with open(path, "w") as handle:
        handle.write(CANARY + "\\n")


def serve(server):
    server.listen(8)
    server.settimeout(0.2)
    end = time.time() + 9
    while time.time() < end:
        try:
            client, _ = server.accept()
            client.sendall(CANARY.encode())
            client.close()
        except OSError:
            pass


unix = socket.socket(socket.AF_UNIX)
unix.bind("\\0orchard-victim")
tcp = socket.socket()
tcp.bind(("127.0.0.1", @@VICTIM_PORT@@))
threads = [threading.Thread(target=serve, args=(s,)) for s in (unix, tcp)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


@dataclass
class ExecRecord:
    """One command a sandbox ran before grading, and what it printed."""

    command: str
    stdout: str
    stderr: str
    exit_code: int | None


@dataclass
class SandboxRecord:
    """What the host knows about one episode's sandbox."""

    uid: int | None
    directory: Path | None
    execs: list[ExecRecord] = field(default_factory=list)


class SpyRuntime(LocalRuntime):
    """The local runtime, keeping each sandbox's uid and the output of its commands until the harness is collected
    (grading output is the grader's, not the sandbox's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, SandboxRecord] = {}

    def create(self, spec: SandboxSpec) -> Any:
        sandbox = super().create(spec)
        directory = getattr(sandbox, "directory", None)
        uid = Path(directory).stat().st_uid if directory is not None else None
        record = self.records[spec.episode_id] = SandboxRecord(uid, directory)
        _spy_on(sandbox, spec.episode_id, record)
        return sandbox


def _spy_on(sandbox: Sandbox, episode_id: str, record: SandboxRecord) -> None:
    inner = sandbox.exec

    def exec_and_keep(command: Sequence[str] | str, **kwargs: Any) -> Any:
        result = inner(command, **kwargs)
        if episode_id not in SNAPSHOTS:
            line = command if isinstance(command, str) else " ".join(command)
            record.execs.append(ExecRecord(line, result.stdout, result.stderr, result.exit_code))
        return result

    sandbox.exec = exec_and_keep  # type: ignore[method-assign]


@dataclass
class Evidence:
    """Everything about one attack's episode."""

    attack: Attack
    episode: Episode
    outcome: dict[str, Any] | None
    record: SandboxRecord
    snapshot: Snapshot
    model_requests: list[dict[str, Any]]
    others: list[SandboxRecord]
    disk_before: int

    @property
    def output(self) -> str:
        """Every byte the sandbox's commands printed before grading."""
        return "\n".join(e.stdout + "\n" + e.stderr for e in self.record.execs)

    def reports(self, kind: str) -> list[str]:
        """The attack's own ``KIND: text`` lines."""
        prefix = f"{kind}: "
        return [line[len(prefix) :] for line in self.output.splitlines() if line.startswith(prefix)]

    def channels(self, secret: str) -> list[str]:
        """Where ``secret`` shows up in what the sandbox could send out."""
        found = ["its output"] if secret in self.output else []
        found += [f"file {path}" for path, data in self.snapshot.files.items() if secret.encode() in data][:3]
        found += ["a model call"] if any(secret in json.dumps(body) for body in self.model_requests) else []
        found += ["its patch"] if secret in self.snapshot.patch else []
        return found


@dataclass
class RedTeamStack:
    """The running stack; ``run`` one attack, ``judge`` its evidence."""

    root: Path
    bus: Bus
    producer: Producer
    backend: ExpertBackend
    backend_log: RequestLog
    servers: list[BackgroundServer]
    proxy: BackgroundServer
    runtime: SpyRuntime
    tasks: TaskCatalog
    task_ids: dict[TaskKind, str]
    secrets: dict[str, str]
    canaries: host.HostCanaries
    context: dict[str, object]
    admin_token: str
    run_id: str = RUN_ID

    def read(self, topic: str) -> list[dict[str, Any]]:
        """Every record of a topic, decoded."""
        codec, out = Codec.default(), []
        reader = self.bus.consumer([topic])
        try:
            while batch := reader.poll(max_records=500, timeout_s=0.2):
                out.extend(codec.decode(r.value).record for r in batch)
        finally:
            reader.close()
        return out

    def request(self, kind: TaskKind, script: str, lang: str, timeout_s: float) -> dict[str, Any]:
        """An Env episode request running ``script`` as the harness on the task of ``kind``."""
        options = {"script": script, "lang": lang, "timeout_s": timeout_s}
        return {"task_id": self.task_ids[kind], "harness": NAME, "model": MODEL, "options": {"harness": options}}

    def run(self, attack: Attack) -> Evidence:
        """One episode of ``attack`` (and of a victim beside it when the attack wants one)."""
        episode_id, victim_id = f"rt-{attack.slug}", f"rt-victim-{attack.slug}"[:63]
        hidden_test = HIDDEN_TEST_FILE if attack.task_kind == "swe" else "tests/none.py"
        context = {**self.context, "EPISODE": episode_id, "VICTIM": victim_id, "HIDDEN_TEST_FILE": hidden_test}
        requests: dict[str, dict[str, Any]] = {}
        if attack.victim:
            canary = host.canary("victim")
            self.secrets["victim"] = canary
            victim = render(VICTIM, {"VICTIM_CANARY": canary, "VICTIM_PORT": VICTIM_PORT})
            requests[victim_id] = self.request(attack.task_kind, victim, "py", 15.0)
        requests[episode_id] = self.request(attack.task_kind, render(attack.script, context), attack.lang,
                                            attack.timeout_s)  # fmt: skip
        for key in requests:
            self.backend.register(key, ScriptedPlan(final_text="ok", model=MODEL))
        disk_before = host.disk_free(self.root)
        episodes = {e.episode_id: e for e in self._run_episodes(requests)}
        outcomes = {o["episode_id"]: o for o in self.read(OUTCOMES)}
        bodies = [body for episode, body in self.backend_log.requests if episode == episode_id]
        record = self.runtime.records.get(episode_id) or SandboxRecord(None, None)
        others = [self.runtime.records[k] for k in requests if k != episode_id and k in self.runtime.records]
        snapshot = SNAPSHOTS.get(episode_id, Snapshot())
        return Evidence(attack, episodes[episode_id], outcomes.get(episode_id), record, snapshot, bodies, others,
                        disk_before)  # fmt: skip

    def _run_episodes(self, requests: Mapping[str, dict[str, Any]]) -> list[Episode]:
        async def scenario() -> list[Episode]:
            admin = ProxyAdmin(self.proxy.url, self.admin_token)
            runner = LocalEpisodeRunner(
                runtime=self.runtime, tasks=self.tasks, proxy=admin, proxy_url=self.proxy.url,
                producer=self.producer, run_id=self.run_id,
            )  # fmt: skip
            scheduler = Scheduler(runner, concurrency=len(requests), timeout_s=EPISODE_TIMEOUT_S)
            for episode_id, request in requests.items():
                scheduler.submit(request, episode_id)
            episodes = [await scheduler.wait(episode_id) for episode_id in requests]
            await admin.aclose()
            return episodes

        return asyncio.run(scenario())

    # -------------------------------------------------------------------------------------------------- verdict
    def judge(self, evidence: Evidence) -> list[str]:
        """Every breach of the episode (empty: the attack failed)."""
        breaches = unearned(evidence)
        for name, value in sorted(self.secrets.items()):
            if channels := evidence.channels(value):
                breaches.append(f"secret {name} leaked via {', '.join(channels)}")
        breaches += [f"observed: {line}" for line in evidence.reports("BREACH")]
        breaches += self.host_changes(evidence)
        if evidence.attack.judge is not None:
            breaches += evidence.attack.judge(self, evidence)
        return breaches

    def host_changes(self, evidence: Evidence) -> list[str]:
        """What the episode left on the host (cleaned up, so the next attack starts from a clean host)."""
        breaches = [f"host: {change}" for change in self.canaries.tampered()]
        self.canaries.baseline = self.canaries.snapshot()
        for record in [evidence.record, *evidence.others]:
            if record.uid is None or record.uid == 0:
                continue
            if pids := host.leftover_processes(record.uid):
                breaches.append(f"host: {len(pids)} processes of the sandbox's uid outlived it")
            if strays := host.files_owned_by(record.uid, [self.root, *self.canaries.roots]):
                breaches.append(f"host: files of the sandbox's uid left on the host: {strays[:5]}")
                host.remove_strays(strays)
            if keys := host.keys_of(record.uid):
                breaches.append(f"host: {keys} kernel keys of the sandbox's uid outlived it")
        for path in evidence.reports("WROTE"):
            if Path(path).is_relative_to(self.runtime.root):
                continue  # the sandbox's own directory, as it sees it
            if Path(path).exists() or Path(path).is_symlink():
                breaches.append(f"host: the sandbox created {path}")
                host.remove_strays([path])
        if left := sorted(p.name for p in self.runtime.root.iterdir() if p.name.startswith("rt-")):
            breaches.append(f"host: sandbox directories left under the runtime root: {left}")
            host.remove_strays([str(self.runtime.root / name) for name in left])
        if self.runtime.list():
            breaches.append(f"host: live sandboxes left: {[s.spec.sandbox_id for s in self.runtime.list()]}")
        dropped = evidence.disk_before - host.disk_free(self.root)
        if dropped > host.DISK_DROP_LIMIT:
            breaches.append(f"host: {dropped // host.MIB} MiB of disk not given back")
        return breaches

    def close(self) -> None:
        """Stop everything and remove what was planted."""
        self.runtime.close()
        for server in reversed(self.servers):
            server.stop()
        self.bus.close()
        host.remove(self.canaries)
        shutil.rmtree(self.root, ignore_errors=True)


def unearned(evidence: Evidence) -> list[str]:
    """Reward, success and signals the episode got although the attack solved nothing."""
    episode, breaches = evidence.episode, []
    if episode.state == EpisodeState.SUCCEEDED:
        breaches.append("the episode SUCCEEDED")
    if float(episode.result.get("reward", 0.0)) > 0:
        breaches.append(f"reward {episode.result['reward']}")
    outcome = evidence.outcome or {}
    if outcome.get("success") or float(outcome.get("reward") or 0.0) > 0:
        breaches.append(f"published outcome: reward {outcome.get('reward')}, success {outcome.get('success')}")
    if episode.state == EpisodeState.CRASHED and not str(episode.error or "").startswith("harness "):
        # the harness exited cleanly; an ungraded CRASHED outcome is one the trainers skip instead of learning from
        breaches.append(f"escaped grading: the platform ended the episode CRASHED ({episode.error})"[:300])
    signals = {**(outcome.get("signals") or {}), **episode.result.get("signals", {})}
    for name in UNEARNED_SIGNALS[evidence.attack.task_kind]:
        if float(signals.get(name, 0.0)) > 0:
            breaches.append(f"signal {name}={signals[name]}")
    return breaches


def ran(evidence: Evidence) -> bool:
    """Whether the attack script really started in the sandbox."""
    return RAN_MARKER in evidence.output


# ---------------------------------------------------------------------------------------------------- building
def _with_limits(task_dir: Path, **fields: object) -> None:
    spec = yaml.safe_load((task_dir / "task.yaml").read_text())
    spec.update(fields, limits=LIMITS)
    (task_dir / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def build_tasks(tasks: Path) -> tuple[dict[TaskKind, str], dict[str, str]]:
    """A file-lookup task (its generator) and a SWE task (the suite's builder) under ``tasks``; their ids by kind and
    the secrets an attacker must not get: the lookup reference, the SWE fix and hidden test names."""
    staging = tasks.parent / "lookup-staging"
    generate(LookupConfig(train_tasks=1, eval_tasks=1, harness_timeout_s=60, grade_timeout_s=15), staging)
    lookup_dir = next((staging / "train").iterdir())
    shutil.move(lookup_dir, tasks / lookup_dir.name)
    shutil.rmtree(staging)
    _with_limits(tasks / lookup_dir.name)
    lookup = LookupTask.from_directory(tasks / lookup_dir.name)
    config = BuildConfig(python=sys.executable, harness_timeout_s=60, grade_timeout_s=60)
    instance = write_task(INSTANCE, tasks / INSTANCE.name, config)
    _with_limits(tasks / INSTANCE.name)
    fixed = next(line.strip() for line in (INSTANCE / "fix" / "retry" / "policy.py").read_text().splitlines()
                 if "delay =" in line)  # fmt: skip
    found = {"lookup-reference": f'"answer": "{lookup.answer}"', "swe-fix": fixed}
    found |= {f"swe-hidden-test-{i}": test.rsplit("::", 1)[1] for i, test in enumerate(instance.FAIL_TO_PASS)}
    return {"lookup": lookup.task_id, "swe": instance.instance_id}, found


def build_stack() -> RedTeamStack:
    """Plant the canaries, build the tasks, start the services (as root: the runtime drops to per-sandbox uids, and
    the canaries go where only root may write)."""
    if os.geteuid() != 0:
        raise RuntimeError("the red team runs the local runtime as root; run the security tests as root")
    canaries = host.plant(INSTANCE / "fix" / "retry" / "policy.py", FIX_RELPATH)
    root = Path(f"/var/lib/orchard-redteam-env-{secrets.token_hex(4)}")
    (root / "tasks").mkdir(parents=True)
    root.chmod(0o755)
    bus = open_bus(EmbeddedBusConfig(path=root / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    backend = ExpertBackend(model=MODEL, policy_version=1)
    backend_log = RequestLog(backend)
    engine = BackgroundServer(backend_log, lifespan="off").start()
    admin_token = secrets.token_urlsafe(24)
    settings = ProxySettings(backend_base_url=f"{engine.url}/v1", admin_token=admin_token, run_id=RUN_ID)
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    task_ids, task_secrets = build_tasks(root / "tasks")
    store = {"type": "local", "path": str(root / "store")}
    config = OrchardConfig(bus=EmbeddedBusConfig(path=root / "bus"), store=store)
    (root / "store").mkdir()
    hidden = sandbox_hidden_paths(config, root / "tasks", [SUITE_DIR])
    runtime = SpyRuntime(root / "sandboxes", hidden_paths=hidden)
    env_token = secrets.token_urlsafe(24)
    env_api = BackgroundServer(create_sandbox_app(runtime, env_token, reap_interval_s=None)).start()
    ports = {"proxy": proxy.port, "engine": engine.port, "env-api": env_api.port, **canaries.services.ports}
    context: dict[str, object] = {
        "PYTHON": sys.executable, "VENV_SITE": sysconfig.get_paths()["purelib"], "HOST_IP": host.host_address(),
        "HOST_PORTS": " ".join(f"{name}:{port}" for name, port in ports.items()),
        "CANARY_ROOT": canaries.paths["root"], "CANARY_LIB": canaries.paths["lib"],
        "CANARY_SOCKET": canaries.paths["socket"], "REPO": REPO, "SUITE": SUITE_DIR, "TASKS": root / "tasks",
        "BUS": root / "bus", "STORE": root / "store", "RUNTIME_ROOT": runtime.root, "MODEL": MODEL,
        "ADMIN_GUESS": "admin-secret-0123456789", "LIMIT_PROCESSES": LIMITS["processes"],
        "LIMIT_MEMORY_MB": LIMITS["memory_mb"], "LIMIT_DISK_MB": LIMITS["disk_mb"], "LIMIT_CPUS": LIMITS["cpus"],
        "LIMIT_OPEN_FILES": LIMITS["open_files"],
    }  # fmt: skip
    all_secrets = {**canaries.secrets, **task_secrets, "proxy-admin-token": admin_token, "env-api-token": env_token}
    return RedTeamStack(
        root=root, bus=bus, producer=bus.producer(), backend=backend, backend_log=backend_log,
        servers=[engine, proxy, env_api], proxy=proxy, runtime=runtime, tasks=TaskCatalog(root / "tasks"),
        task_ids=task_ids, secrets=all_secrets, canaries=canaries, context=context, admin_token=admin_token,
    )  # fmt: skip
