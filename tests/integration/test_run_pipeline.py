"""A shortened file-lookup recipe through ``orchard run`` stages, end to end: the expert's demonstrations run as
episodes (built-in harness, local sandboxes, recording proxy), become trajectories and SFT samples, the policy trainer
publishes two versions, and the tiny engine started with ``--reload`` serves the newer one.

The same recipe runs on the embedded defaults and on Apache Kafka + S3, the backends chosen only by ``ORCHARD_BUS__*``
/ ``ORCHARD_STORE__*`` in the environment. A second test stops a run with SIGINT (Ctrl-C) during its RL stage and
finishes it with ``orchard run --resume``: nothing the first start did is lost or done again.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchard.artifacts import checkpoint_artifact_name
from orchard.bus import Bus, TopicPartition, open_bus
from orchard.codec import Codec
from orchard.config import LocalStoreConfig, load_config
from orchard.serialization_errors import SerializationError
from orchard.store import open_store
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES
from recipes.file_lookup.expert import Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import LookupConfig, generate

pytestmark = [pytest.mark.slow, pytest.mark.harness]
ORCHARD = Path(sys.executable).with_name("orchard")
REPO = Path(__file__).resolve().parents[2]
TASKS = 3
FINISHED = ("stopped", "exited", "failed")

CHECK_ENGINE = '''
"""Wait until the engine serves policy version >= 2, then ask it once; print what it says (read by the test)."""
import json, sys, time
import httpx

url, wanted = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
health = {}
while time.monotonic() < deadline:
    try:
        health = httpx.get(f"{url}/healthz", timeout=5).json()
    except httpx.HTTPError:
        health = {}
    if (health.get("policy_version") or 0) >= wanted:
        break
    time.sleep(0.5)
body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
print(json.dumps({"healthz": health, "completion_version": (reply.get("orchard") or {}).get("policy_version")}))
sys.exit(0 if (health.get("policy_version") or 0) >= wanted else 1)
'''


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_recipe(tmp_path: Path, *, run_id: str = "pipeline", max_steps: int = 2, demo_tag: str = "") -> Path:
    """The shortened recipe (tasks, demonstrations, engine check script) in ``tmp_path``; the trainer publishes (and
    checkpoints) every step up to ``max_steps``, and the last stage waits for the engine to serve that version.

    ``batch_tokens`` is below any sample's length, so every step trains exactly one sample (a longer one gets a
    micro-batch of its own): the steps reachable do not depend on how long this run's samples happen to be.
    """
    generate(LookupConfig(train_tasks=TASKS, eval_tasks=1), tmp_path / "tasks")
    write_demonstrations(tmp_path / "tasks" / "train", tmp_path / "demos", Expert(ExpertConfig(imperfect_fraction=0)))
    if demo_tag:
        tag_demonstrations(tmp_path / "demos", demo_tag)
    (tmp_path / "check_engine.py").write_text(CHECK_ENGINE)
    expert, proxy, env, engine, proxy2, env2 = (free_port() for _ in range(6))
    trainer = ["model={type: tiny, name: tiny-llama}", "publish_every=1", "checkpoint_every=1",
               f"max_steps={max_steps}", "batch_tokens=64", "grad_accum=1", "idle_flush_s=1", "cpu_threads=1",
               "lr=1e-3", "run_dir={run_dir}/trainer"]  # fmt: skip
    recipe: dict[str, Any] = {
        "run_id": run_id,
        "components": {
            "expert": {
                "kind": "command",
                "port": expert,
                "health": {"type": "http", "path": "/v1/models"},
                "run": [
                    "python",
                    "-m",
                    "recipes.file_lookup.expert",
                    "serve",
                    "{recipe_dir}/demos",
                    "--port",
                    str(expert),
                ],
            },  # fmt: skip
            "proxy": {"kind": "proxy", "backend": "expert", "port": proxy},
            "env": {"kind": "env", "tasks": "tasks/train", "proxy": "proxy", "port": env, "timeout_s": 120},
            "assembler": {"kind": "consumer", "name": "assembler", "after": ["proxy"]},
            "builder": {
                "kind": "consumer",
                "name": "sample-builder",
                "after": ["assembler"],
                "env": {
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS": '["SFT"]',
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__SFT_SUCCESSFUL_ONLY": "true",
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE": "1",
                },
            },  # fmt: skip
            "policy-proxy": {"kind": "proxy", "backend": "engine", "port": proxy2},
            "policy-env": {
                "kind": "env",
                "tasks": "tasks/train",
                "proxy": "policy-proxy",
                "port": env2,
                "timeout_s": 120,
            },
            "rollout": {
                "kind": "rollout",
                "service": "policy-env",
                "tasks": "tasks/train",
                "model": "tiny-llama",
                "rounds": 1,
                "episodes": 2,
                "budget": 3,
                "min_rollouts": 1,
                "wait_timeout_s": 150,
            },
            "rl-builder": {
                "kind": "consumer",
                "name": "sample-builder",
                "group": "sample-builder-rl",
                "after": ["assembler"],
                "env": {
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS": '["RL"]',
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__EMIT_ZERO_SAMPLES": "true",
                    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE": "1",
                },
            },
            "engine": {"kind": "engine", "model": "tiny-llama", "port": engine, "reload": True, "max_batch_size": 2},
            "demos": {
                "kind": "rollout",
                "service": "env",
                "tasks": "tasks/train",
                "demos": "demos",
                "model": "file-lookup-expert",
                "wait_timeout_s": 120,
            },  # fmt: skip
            "trainer": {"kind": "policy-trainer", "set": trainer, "restart": {"policy": "never"}},
            "check": {
                "kind": "command",
                "run": ["python", "{recipe_dir}/check_engine.py", f"http://127.0.0.1:{engine}", str(max_steps)],
                "restart": {"policy": "never"},
            },  # fmt: skip
        },
        "restart": {"max_restarts": 2, "backoff_s": 0.5},
        "stages": [
            {
                "name": "demos",
                "components": ["demos"],
                "until": {"exits": ["demos"], "topic": "samples", "count": TASKS},
                "stop": ["builder"],
                "timeout_s": 60,
            },  # fmt: skip
            {
                "name": "rl",
                "components": ["rollout", "rl-builder", "trainer"],
                "until": {"exits": ["rollout", "trainer"], "policy_version": max_steps},
                "timeout_s": 150,
            },  # fmt: skip
            {"name": "serve-newest", "components": ["check"], "timeout_s": 60},
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def tag_demonstrations(demos: Path, tag: str) -> None:
    """Rename the demonstration episodes ``demo-<task>-<n>`` to ``demo-<tag>-<task>-<n>``.

    Episode ids must be unique across the runs sharing a bus, and the expert's are the same in every run of the same
    tasks; on a shared Kafka cluster the assembler would drop a rerun's demonstrations as late duplicates.
    """
    lines = (demos / "demonstrations.jsonl").read_text().splitlines()
    renamed = []
    for line in filter(None, lines):
        entry = json.loads(line)
        new_id = entry["episode_id"].replace("demo-", f"demo-{tag}-", 1)
        (demos / "plans" / f"{entry['episode_id']}.yaml").rename(demos / "plans" / f"{new_id}.yaml")
        renamed.append(json.dumps({**entry, "episode_id": new_id}))
    (demos / "demonstrations.jsonl").write_text("\n".join(renamed) + "\n")


@dataclass(frozen=True)
class Backends:
    """The bus and store of one variant: environment variables for ``orchard run``, and the run's identity."""

    name: str
    run_id: str
    demo_tag: str = ""
    env: dict[str, str] = field(default_factory=dict)


@pytest.fixture(params=["embedded", pytest.param("kafka-s3", marks=[pytest.mark.kafka, pytest.mark.s3])])
def backends(request: pytest.FixtureRequest, unique_name: Callable[[str], str]) -> Backends:
    """The embedded defaults (nothing set), or Kafka + S3 chosen by ``ORCHARD_BUS__*`` / ``ORCHARD_STORE__*`` only,
    with a run id, a bucket and demonstration episode ids of this test's own (the broker is shared)."""
    if request.param == "embedded":
        return Backends("embedded", "pipeline")
    bootstrap: str = request.getfixturevalue("kafka_bootstrap")
    s3: Any = request.getfixturevalue("s3_service")
    env = {"ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": bootstrap,
           "ORCHARD_STORE__TYPE": "s3", "ORCHARD_STORE__ENDPOINT": s3.endpoint,
           "ORCHARD_STORE__BUCKET": unique_name("pipeline"),
           "ORCHARD_STORE__ACCESS_KEY": s3.access_key, "ORCHARD_STORE__SECRET_KEY": s3.secret_key}  # fmt: skip
    return Backends("kafka-s3", unique_name("pipeline"), secrets.token_hex(3), env)


def orchard_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any bus/store settings of its own, plus ``extra``."""
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "PYTHONPATH": str(REPO)}
    for name in [k for k in env if k.startswith(("ORCHARD_BUS__", "ORCHARD_STORE__"))] + ["ORCHARD_CONFIG"]:
        env.pop(name, None)
    return {**env, **(extra or {})}


def read_run(bus: Bus, topic: str, run_id: str, deadline_s: float = 60.0) -> list[tuple[str, dict[str, Any]]]:
    """Every record of run ``run_id`` on ``topic``, as (schema name, record), read to the topic's current end.

    The end is reached by position, not by a quiet poll: on Kafka the first polls may come back empty, and
    transaction markers take offsets that no record is returned for.
    """
    codec, out = Codec.default(), []
    info = bus.describe_topic(topic)
    ends = {TopicPartition(topic, p): end for p, end in info.end_offsets.items() if end > info.start_offsets.get(p, 0)}
    reader = bus.consumer([topic], group=None, start="earliest")
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            for record in reader.poll(max_records=500, timeout_s=1.0):
                try:
                    decoded = codec.decode(record.value)
                except SerializationError:
                    continue  # a shared broker's topics may hold other tests' malformed records
                if decoded.record.get("run_id") == run_id:
                    out.append((decoded.name, decoded.record))
            position = reader.position()
            if all(position.get(tp, 0) >= end for tp, end in ends.items()):
                return out
    finally:
        reader.close()
    raise AssertionError(f"{topic}: not read to its end {ends} within {deadline_s:g} s")


@dataclass
class Flow:
    """What one run put on the bus."""

    outcomes: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    versions: list[dict[str, Any]]


def read_flow(run_dir: Path, run_id: str) -> Flow:
    """Outcomes, model calls, samples and policy versions of the run, from the bus its ``orchard.yaml`` names."""
    bus = open_bus(load_config(run_dir / "orchard.yaml").bus)
    try:
        topics = {t: read_run(bus, t, run_id) for t in (OUTCOMES, MODEL_CALLS, SAMPLES, POLICY_VERSIONS)}
    finally:
        bus.close()
    wanted = {OUTCOMES: "EpisodeOutcome", MODEL_CALLS: "ModelCall", SAMPLES: "TrainingSample",
              POLICY_VERSIONS: "PolicyVersion"}  # fmt: skip
    records = {t: [r for name, r in topics[t] if name == wanted[t]] for t in topics}
    return Flow(records[OUTCOMES], records[MODEL_CALLS], records[SAMPLES], records[POLICY_VERSIONS])


def run_logs(run_dir: Path) -> dict[str, str]:
    """The tail of each component's log (for failure messages)."""
    return {p.name: p.read_text()[-3000:] for p in (run_dir / "logs").glob("*.log")}


def engine_check(run_dir: Path) -> dict[str, Any]:
    """What the check component printed last: the engine's /healthz and a completion's policy version."""
    log = (run_dir / "logs" / "check.log").read_text()
    lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"healthz"')]
    assert lines, log[-3000:]
    return lines[-1]


def starts_of(run_dir: Path, component: str) -> list[int]:
    """The ``run_start`` of every start of ``component`` (from the headers of its log)."""
    path = run_dir / "logs" / f"{component}.log"
    if not path.exists():
        return []
    headers = [line for line in path.read_text().splitlines() if '"orchard run: starting component"' in line]
    return [json.loads(line)["run_start"] for line in headers]


@pytest.mark.timeout(400)
def test_recipe_stages_take_demonstrations_to_samples_to_two_policy_versions_served_by_the_reloading_engine(
    tmp_path: Path, backends: Backends
) -> None:
    recipe = write_recipe(tmp_path, run_id=backends.run_id, demo_tag=backends.demo_tag)
    run_dir = tmp_path / "run"
    result = subprocess.run(  # noqa: S603 - fixed command
        [str(ORCHARD), "run", str(recipe), "--run-dir", str(run_dir), "--no-live", "--duration", "330"],
        env=orchard_env(backends.env), cwd=REPO, capture_output=True, timeout=360, check=False,
    )  # fmt: skip
    state = json.loads((run_dir / "state.json").read_text())
    assert result.returncode == 0, (result.stderr.decode()[-3000:], state, run_logs(run_dir))
    assert state["status"] == "completed", state["reason"]
    assert [(s["name"], s["status"]) for s in state["stages"]] == [
        ("demos", "completed"),
        ("rl", "completed"),
        ("serve-newest", "completed"),
    ]
    settings = load_config(run_dir / "orchard.yaml")
    if backends.name == "kafka-s3":  # every component read these, through ORCHARD_CONFIG and the environment
        assert (settings.bus.type, settings.store.type) == ("kafka", "s3")
        assert not (run_dir / "bus").exists() and not (run_dir / "store").exists()

    flow = read_flow(run_dir, backends.run_id)
    prefix = f"demo-{backends.demo_tag}-" if backends.demo_tag else "demo-"
    demos = [o for o in flow.outcomes if o["episode_id"].startswith("demo-")]
    assert sorted(o["episode_id"] for o in demos) == [f"{prefix}file-lookup-train-{i:05d}-0" for i in range(TASKS)]
    assert all(o["success"] for o in demos), demos
    assert len(flow.outcomes) == TASKS + 2  # the demonstrations, then two episodes of the policy
    assert {c["episode_id"] for c in flow.calls} == {o["episode_id"] for o in flow.outcomes}
    assert flow.samples and {s["episode_id"] for s in flow.samples} <= {o["episode_id"] for o in flow.outcomes}
    assert {v["version"] for v in flow.versions} >= {1, 2}
    store_scheme = "s3://" if backends.name == "kafka-s3" else "file://"
    assert all(v["uri"].startswith(store_scheme) for v in flow.versions), flow.versions

    check = engine_check(run_dir)
    assert check["healthz"]["policy_version"] >= 2
    assert check["completion_version"] >= 2


def wait_for(
    what: str, ready: Callable[[], bool], process: subprocess.Popen[bytes], run_dir: Path, timeout_s: float
) -> None:
    """Poll ``ready`` until it holds; fail (with the logs) if the run ends first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if process.poll() is not None:
            raise AssertionError((f"the run ended before {what}", process.returncode, run_logs(run_dir)))
        if time.monotonic() >= deadline:
            raise AssertionError((f"no {what} within {timeout_s:g} s", run_logs(run_dir)))
        time.sleep(0.2)


def run_state(run_dir: Path) -> dict[str, Any]:
    """``state.json`` ({} before the supervisor wrote it)."""
    try:
        state: dict[str, Any] = json.loads((run_dir / "state.json").read_text())
    except FileNotFoundError:
        return {}
    return state


def alive(pid: int | None) -> bool:
    """Whether process ``pid`` still exists."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(450)
def test_ctrl_c_during_the_rl_stage_then_resume_finishes_the_run_with_nothing_lost_or_done_twice(
    tmp_path: Path,
) -> None:
    steps = 6  # the demonstrations alone give six samples (SFT and RL), one step each: reachable however it stops
    recipe = write_recipe(tmp_path, run_id="resume", max_steps=steps)
    run_dir = tmp_path / "run"
    checkpoints = checkpoint_artifact_name("resume", "policy")

    def interrupted_mid_rl() -> bool:
        """The RL stage runs and the trainer has checkpointed at least once (it has steps left: see ``steps``)."""
        stages = {s["name"]: s["status"] for s in run_state(run_dir).get("stages", [])}
        if stages.get("rl") != "running" or not (run_dir / "store").exists():
            return False
        store = open_store(LocalStoreConfig(path=run_dir / "store"))
        try:
            return bool(store.list_versions(checkpoints))
        finally:
            store.close()

    with (tmp_path / "first.log").open("wb") as output:
        first = subprocess.Popen(  # noqa: S603 - fixed command
            [str(ORCHARD), "run", str(recipe), "--run-dir", str(run_dir), "--no-live", "--duration", "300"],
            env=orchard_env(), cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for("trainer checkpoint during the rl stage", interrupted_mid_rl, first, run_dir, timeout_s=200)
            first.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal sends the supervisor
            assert first.wait(timeout=180) == 130, ((tmp_path / "first.log").read_text()[-3000:], run_logs(run_dir))
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()

    stopped = run_state(run_dir)
    assert (stopped["status"], stopped["reason"], stopped["supervisor_pid"]) == ("stopped", "signal", None)
    assert [(s["name"], s["status"]) for s in stopped["stages"]] == [
        ("demos", "completed"),
        ("rl", "running"),
        ("serve-newest", "pending"),
    ]
    assert all(c["status"] in FINISHED and not alive(c["pid"]) for c in stopped["components"].values()), stopped
    # each stopped within its grace period: Env published the outcomes of the episodes it cancelled
    assert all(c["exit_code"] != -signal.SIGKILL for c in stopped["components"].values()), stopped
    before = read_flow(run_dir, "resume")
    assert before.versions, "the trainer had checkpointed, so it had published"

    resumed = subprocess.run(  # noqa: S603 - fixed command
        [str(ORCHARD), "run", "--resume", str(run_dir), "--no-live", "--duration", "300"],
        env=orchard_env(), cwd=REPO, capture_output=True, timeout=330, check=False,
    )  # fmt: skip
    state = run_state(run_dir)
    assert resumed.returncode == 0, (resumed.stderr.decode()[-3000:], state, run_logs(run_dir))
    assert (state["status"], state["starts"]) == ("completed", 2), state["reason"]
    assert [s["status"] for s in state["stages"]] == ["completed"] * 3

    # the completed stage is not run again, nor what it stopped
    assert starts_of(run_dir, "demos") == [1] and starts_of(run_dir, "builder") == [1]
    flow = read_flow(run_dir, "resume")
    outcomes = Counter(o["episode_id"] for o in flow.outcomes)
    assert all(count == 1 for count in outcomes.values()), outcomes
    assert sorted(e for e in outcomes if e.startswith("demo-")) == [
        f"demo-file-lookup-train-{i:05d}-0" for i in range(TASKS)
    ]
    assert {c["episode_id"] for c in flow.calls} <= set(outcomes)
    calls = Counter((c["episode_id"], c["call_index"]) for c in flow.calls)
    assert all(count == 1 for count in calls.values()), calls
    # no sample twice, and every episode the builders saw before the stop kept exactly its samples
    sample_ids = Counter(s["sample_id"] for s in flow.samples)
    assert all(count == 1 for count in sample_ids.values()), sample_ids
    assert {s["sample_id"] for s in before.samples} <= set(sample_ids)
    # versions continue from the checkpoint: each number one content, 1..steps, none skipped
    contents: dict[int, set[str]] = {}
    for version in flow.versions:
        contents.setdefault(version["version"], set()).add(version["sha256"])
    assert sorted(contents) == list(range(1, steps + 1)) and all(len(s) == 1 for s in contents.values()), contents
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    second_start = trainer_log[trainer_log.rindex('"orchard run: starting component"') :]
    if starts_of(run_dir, "trainer")[-1] == 2:  # it had not finished before the stop: it continued, not restarted
        assert '"event": "resumed"' in second_start and "no checkpoint" not in second_start, second_start[-3000:]

    check = engine_check(run_dir)
    assert check["healthz"]["policy_version"] == steps and check["completion_version"] == steps
