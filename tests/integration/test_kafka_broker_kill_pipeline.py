"""Broker faults under a whole standalone pipeline: a partition leader of a 3-broker cluster is killed with SIGKILL,
restarted on its port, then another one, while file-lookup demonstrations flow through every component.

Each component is its own OS process, started as ``orchard run`` would start it but with no supervisor to restart
anything: the file-lookup expert backend, the recording proxy (``model-calls``), Orchard Env (``outcomes``),
``orchard rollout run --demos``, the assembler (``trajectories``), the sample builder (``samples``: SFT, one per
successful episode) and the policy trainer on the tiny model (``policy-versions``; one sample per step, so it stops
at ``max_steps`` only once it has trained every sample). Topics have replication 3 and ``min.insync.replicas`` 2, so
one broker down at a time loses no acknowledged write; what the test proves is that no process gives up meanwhile
(issue 21: the assembler, the sample builder and the rollout exited 1 on ``Failed to get watermark offsets: Local:
Timed out``) and that every count read back (``read_committed``) is exact.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from orchard.bus import TopicPartition
from orchard.bus.kafka import KafkaBus
from orchard.codec import Codec
from orchard.config import KafkaBusConfig
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES, STANDARD_TOPICS, TRAJECTORIES
from recipes.file_lookup.expert import Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import LookupConfig, generate

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
ORCHARD = str(Path(sys.executable).with_name("orchard"))
EPISODES = 30
RUN_ID = "broker-kill"
SERVERS = ("expert", "proxy", "env")
WORKERS = ("assembler", "builder", "trainer", "rollout")
# Each model answer waits this long, so episodes are still running at the second kill: without it all 30 were done
# by then in 2 of 5 runs (the replicas take 25-40 s to catch up after the first kill).
EXPERT_LATENCY_S = 0.6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Pipeline:
    """The component processes of one run and where their logs go."""

    work: Path
    env: dict[str, str]
    urls: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, command: list[str], extra: dict[str, str] | None = None) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(  # noqa: S603 - fixed commands
            command, cwd=REPO, env={**self.env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT
        )

    def logs(self, lines: int = 40) -> str:
        tails = []
        for name in self.processes:
            text = (self.work / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {name} (exit {self.processes[name].poll()})\n" + "\n".join(text))
        return "\n".join(tails)

    def exited(self) -> dict[str, int]:
        """Components that exited, with their codes (the rollout and the trainer exit 0 when done)."""
        return {name: code for name, p in self.processes.items() if (code := p.poll()) is not None}


def component_env(work: Path, bootstrap: str) -> dict[str, str]:
    """What ``orchard run`` gives its components: run id, Kafka bus, local store, secrets, JSON logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHARD_BUS__", "ORCHARD_STORE__"))}
    return env | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ORCHARD_RUN_ID": RUN_ID, "ORCHARD_LOG_FORMAT": "json",
        "ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": bootstrap,
        "ORCHARD_STORE__TYPE": "local", "ORCHARD_STORE__PATH": str(work / "store"),
        "ORCHARD_PROXY_ADMIN_TOKEN": secrets.token_urlsafe(16), "ORCHARD_ENV_TOKEN": secrets.token_urlsafe(16),
    }  # fmt: skip


def start_servers(pipeline: Pipeline) -> None:
    """The expert backend, the recording proxy and Env, each answering before the next starts."""
    ports = {name: free_port() for name in SERVERS}
    urls = pipeline.urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    work = pipeline.work
    commands = {
        "expert": [sys.executable, "-m", "recipes.file_lookup.expert", "serve", str(work / "demos"),
                   "--port", str(ports["expert"]), "--latency-s", str(EXPERT_LATENCY_S)],
        "proxy": [ORCHARD, "proxy", "serve", "--backend", f"{urls['expert']}/v1", "--port", str(ports["proxy"])],
        "env": [ORCHARD, "env", "serve", "--tasks", str(work / "tasks" / "train"), "--proxy", urls["proxy"],
                "--port", str(ports["env"]), "--concurrency", "1", "--timeout", "120",
                "--sandboxes", str(work / "sandboxes")],
    }  # fmt: skip
    health = {"expert": "/v1/models", "proxy": "/healthz", "env": "/healthz"}
    for name, command in commands.items():
        pipeline.start(name, command)
        wait_until(f"{name} answers", lambda n=name: answers(urls[n] + health[n]), pipeline, 90)


def start_workers(pipeline: Pipeline) -> None:
    """Assembler, sample builder and trainer, then the rollout of every demonstration."""
    builder = {"ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS": '["SFT"]',
               "ORCHARD_CONSUMERS__SAMPLE_BUILDER__SFT_SUCCESSFUL_ONLY": "true",
               "ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE": "1"}  # fmt: skip
    trainer = ["model={type: tiny, name: tiny-llama}", f"max_steps={EPISODES}", "batch_tokens=64", "grad_accum=1",
               "idle_flush_s=1", "cpu_threads=1", "publish_every=10", "checkpoint_every=10", "lr=1e-3",
               f"run_dir={pipeline.work / 'trainer'}"]  # fmt: skip
    pipeline.start("assembler", [ORCHARD, "consumer", "run", "assembler", "--instance", "assembler"])
    pipeline.start("builder", [ORCHARD, "consumer", "run", "sample-builder", "--instance", "builder"], builder)
    pipeline.start("trainer", [ORCHARD, "train", "policy", *(w for s in trainer for w in ("--set", s))])
    work = pipeline.work
    pipeline.start("rollout", [ORCHARD, "rollout", "run", "--env", pipeline.urls["env"],
                               "--tasks", str(work / "tasks" / "train"), "--demos", str(work / "demos"),
                               "--model", "file-lookup-expert", "--wait-timeout", "240"])  # fmt: skip


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(what: str, ready: Callable[[], bool], pipeline: Pipeline, timeout_s: float) -> None:
    """Poll ``ready``; fail with the logs when a component that should still run exits, or on the timeout."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        failed = {name: code for name, code in pipeline.exited().items() if code != 0 or name not in WORKERS}
        assert not failed, (f"exited while waiting for {what}: {failed}", pipeline.logs())
        assert time.monotonic() < deadline, (f"no {what} within {timeout_s:g} s", pipeline.logs())
        time.sleep(0.5)


@contextmanager
def pipeline_of(work: Path, bootstrap: str) -> Iterator[Pipeline]:
    """The pipeline's processes; on the way out each one still running is stopped (Env first)."""
    pipeline = Pipeline(work, component_env(work, bootstrap))
    try:
        yield pipeline
    finally:
        for process in reversed(pipeline.processes.values()):
            if process.poll() is None:
                process.terminate()
        for process in pipeline.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ------------------------------------------------------------------------------------------------ the cluster
def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    leader: int = admin.list_topics(topic=topic, timeout=15).topics[topic].partitions[partition].leader
    return leader


def leader_other_than(bootstrap: str, topic: str, excluded: int) -> int:
    """A broker leading some partition of ``topic`` that is not ``excluded``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = admin.list_topics(topic=topic, timeout=15).topics[topic].partitions.values()
    leaders = sorted({p.leader for p in partitions if p.leader not in (excluded, -1)})
    assert leaders, f"every partition of {topic} is led by broker {excluded}"
    return leaders[0]


def fully_replicated(bootstrap: str) -> bool:
    """Every partition of every topic (the internal ones too) has all its replicas in sync."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        topics = admin.list_topics(timeout=5).topics.values()
    except Exception:  # noqa: BLE001 - a broker just restarted: not yet
        return False
    return all(len(p.isrs) == len(p.replicas) for t in topics for p in t.partitions.values())


def kill_and_restart(service: Any, node: int, down_s: float) -> None:
    """SIGKILL broker ``node``, leave it down ``down_s``, start it again on its port with its data."""
    pid = service.pid(node)
    assert pid is not None, f"broker {node} is not running"
    os.kill(pid, signal.SIGKILL)
    time.sleep(down_s)
    service.start(node)


# ------------------------------------------------------------------------------------------------ reading back
def read_all(bus: KafkaBus, topic: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every committed record of ``topic`` (``read_committed``), decoded, read to its end offsets as of now."""
    info = bus.describe_topic(topic)
    ends = {TopicPartition(topic, p): end for p, end in info.end_offsets.items() if end > info.start_offsets.get(p, 0)}
    reader, codec, out = bus.consumer([topic], group=None, start="earliest"), Codec.default(), []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            out.extend(codec.decode(r.value).record for r in reader.poll(max_records=500, timeout_s=1.0))
            position = reader.position()
            if all(position.get(tp, 0) >= end for tp, end in ends.items()):
                return out
    finally:
        reader.close()
    raise AssertionError(f"{topic}: not read to its end {ends} within {timeout_s:g} s")


def outcome_count(bus: KafkaBus) -> int:
    return bus.describe_topic(OUTCOMES).record_count


def duplicates(values: list[Any]) -> dict[Any, int]:
    return {value: n for value, n in Counter(values).items() if n > 1}


def prepare(work: Path, bus: KafkaBus) -> list[str]:
    """Tasks, perfect expert demonstrations (one episode per task), the standard topics; the episode ids."""
    generate(LookupConfig(train_tasks=EPISODES, eval_tasks=1), work / "tasks")
    write_demonstrations(work / "tasks" / "train", work / "demos", Expert(ExpertConfig(imperfect_fraction=0)))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    return [f"demo-file-lookup-train-{i:05d}-0" for i in range(EPISODES)]


@pytest.mark.timeout(420)
def test_two_broker_kills_under_a_standalone_pipeline_stop_no_component_and_count_every_record_once(
    dedicated_kafka: Callable[..., Any], tmp_path: Path
) -> None:
    started = time.monotonic()
    service = dedicated_kafka(brokers=3)
    bootstrap = service.bootstrap
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=bootstrap))
    episodes = prepare(tmp_path, bus)
    kills: list[tuple[int, int]] = []  # (broker, outcomes on the bus when it was killed)
    marks: dict[str, float] = {}  # phase -> seconds since the start (printed)
    with pipeline_of(tmp_path, bootstrap) as pipeline:
        start_servers(pipeline)
        start_workers(pipeline)
        wait_until("episodes flowing", lambda: outcome_count(bus) >= 3, pipeline, 150)
        marks["first kill"] = time.monotonic() - started
        first = leader_of(bootstrap, MODEL_CALLS, 0)
        kills.append((first, outcome_count(bus)))
        kill_and_restart(service, first, down_s=5.0)
        wait_until("replicas back in sync", lambda: fully_replicated(bootstrap), pipeline, 90)
        marks["second kill"] = time.monotonic() - started
        second = leader_other_than(bootstrap, TRAJECTORIES, excluded=first)
        kills.append((second, outcome_count(bus)))
        kill_and_restart(service, second, down_s=5.0)
        wait_until("the rollout and the trainer done", lambda: {"rollout", "trainer"} <= set(pipeline.exited()),
                   pipeline, 240)  # fmt: skip
        wait_until("every sample", lambda: bus.describe_topic(SAMPLES).record_count >= EPISODES, pipeline, 30)
        still_running = {name for name in ("expert", "proxy", "env", "assembler", "builder")
                         if pipeline.processes[name].poll() is None}  # fmt: skip
        exits = pipeline.exited()
        trainer_log = (tmp_path / "trainer.log").read_text()
        logs = pipeline.logs()
    flow = {topic: read_all(bus, topic) for topic in (MODEL_CALLS, OUTCOMES, TRAJECTORIES, SAMPLES, POLICY_VERSIONS)}
    bus.close()
    print(f"wall {time.monotonic() - started:.1f} s; {marks}; kills (broker, outcomes so far): {kills}")  # noqa: T201

    assert kills[0][0] != kills[1][0] and all(seen < EPISODES for _, seen in kills), kills
    assert (exits, still_running) == ({"rollout": 0, "trainer": 0}, {"expert", "proxy", "env", "assembler",
                                                                      "builder"}), logs  # fmt: skip
    outcomes, trajectories = flow[OUTCOMES], flow[TRAJECTORIES]
    assert sorted(o["episode_id"] for o in outcomes) == episodes  # each exactly once
    assert all(o["success"] for o in outcomes), [o for o in outcomes if not o["success"]]
    assert sorted(t["episode_id"] for t in trajectories) == episodes
    calls = [(c["episode_id"], c["call_index"]) for c in flow[MODEL_CALLS]]
    assert duplicates(calls) == {}
    per_episode = Counter(episode for episode, _ in calls)
    assert {t["episode_id"]: (t["complete"], len(t["calls"])) for t in trajectories} == {
        e: (True, per_episode[e]) for e in episodes
    }
    samples = flow[SAMPLES]
    assert duplicates([s["sample_id"] for s in samples]) == {}
    assert sorted(s["episode_id"] for s in samples) == episodes  # SFT, successful only: one sample per episode
    assert sorted(v["version"] for v in flow[POLICY_VERSIONS]) == [1, 2, 3]  # every 10 steps, up to 30
    assert f'"step": {EPISODES}' in trainer_log, trainer_log[-3000:]
