"""A shortened file-lookup recipe through ``orchard run`` stages, end to end: the expert's demonstrations run as
episodes (built-in harness, local sandboxes, recording proxy), become trajectories and SFT samples, the policy trainer
publishes two versions, and the tiny engine started with ``--reload`` serves the newer one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import load_config
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES
from recipes.file_lookup.expert import Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import LookupConfig, generate

pytestmark = [pytest.mark.slow, pytest.mark.harness]
ORCHARD = Path(sys.executable).with_name("orchard")
REPO = Path(__file__).resolve().parents[2]
TASKS = 3

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


def write_recipe(tmp_path: Path) -> Path:
    generate(LookupConfig(train_tasks=TASKS, eval_tasks=1), tmp_path / "tasks")
    write_demonstrations(tmp_path / "tasks" / "train", tmp_path / "demos", Expert(ExpertConfig(imperfect_fraction=0)))
    (tmp_path / "check_engine.py").write_text(CHECK_ENGINE)
    expert, proxy, env, engine, proxy2, env2 = (free_port() for _ in range(6))
    trainer = ["model={type: tiny, name: tiny-llama}", "publish_every=1", "max_steps=2", "batch_tokens=1024",
               "grad_accum=1", "idle_flush_s=1", "cpu_threads=1", "lr=1e-3", "run_dir={run_dir}/trainer"]  # fmt: skip
    recipe: dict[str, Any] = {
        "run_id": "pipeline",
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
                "run": ["python", "{recipe_dir}/check_engine.py", f"http://127.0.0.1:{engine}", "2"],
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
                "until": {"exits": ["rollout", "trainer"], "policy_version": 2},
                "timeout_s": 150,
            },  # fmt: skip
            {"name": "serve-newest", "components": ["check"], "timeout_s": 60},
        ],
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def read(bus: Any, topic: str) -> list[tuple[str, dict[str, Any]]]:
    codec, out = Codec.default(), []
    reader = bus.consumer([topic])
    while batch := reader.poll(max_records=500, timeout_s=0.5):
        for record in batch:
            decoded = codec.decode(record.value)
            out.append((decoded.name, decoded.record))
    reader.close()
    return out


@pytest.mark.timeout(280)
def test_recipe_stages_take_demonstrations_to_samples_to_two_policy_versions_served_by_the_reloading_engine(
    tmp_path: Path,
) -> None:
    recipe = write_recipe(tmp_path)
    run_dir = tmp_path / "run"
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "PYTHONPATH": str(REPO)}
    for name in [k for k in env if k.startswith(("ORCHARD_BUS__", "ORCHARD_STORE__"))] + ["ORCHARD_CONFIG"]:
        env.pop(name, None)
    result = subprocess.run(  # noqa: S603 - fixed command
        [str(ORCHARD), "run", str(recipe), "--run-dir", str(run_dir), "--no-live", "--duration", "240"],
        env=env, cwd=REPO, capture_output=True, timeout=270, check=False,
    )  # fmt: skip
    logs = {p.name: p.read_text()[-3000:] for p in (run_dir / "logs").glob("*.log")}
    state = json.loads((run_dir / "state.json").read_text())
    assert result.returncode == 0, (result.stderr.decode()[-3000:], state, logs)
    assert state["status"] == "completed", state["reason"]
    assert [(s["name"], s["status"]) for s in state["stages"]] == [
        ("demos", "completed"),
        ("rl", "completed"),
        ("serve-newest", "completed"),
    ]

    bus = open_bus(load_config(run_dir / "orchard.yaml").bus)
    try:
        outcomes = [r for name, r in read(bus, OUTCOMES) if name == "EpisodeOutcome"]
        calls = [r for name, r in read(bus, MODEL_CALLS) if name == "ModelCall"]
        samples = [r for name, r in read(bus, SAMPLES) if name == "TrainingSample"]
        versions = [r for name, r in read(bus, POLICY_VERSIONS) if name == "PolicyVersion"]
    finally:
        bus.close()
    demos = [o for o in outcomes if o["episode_id"].startswith("demo-")]
    assert sorted(o["episode_id"] for o in demos) == [f"demo-file-lookup-train-{i:05d}-0" for i in range(TASKS)]
    assert all(o["success"] for o in demos), demos
    assert len(outcomes) == TASKS + 2  # the demonstrations, then two episodes of the policy
    assert {c["episode_id"] for c in calls} == {o["episode_id"] for o in outcomes}
    assert samples and all(s["run_id"] == "pipeline" for s in samples)
    assert len({v["version"] for v in versions}) >= 2 and max(v["version"] for v in versions) >= 2

    check = [json.loads(line) for line in logs["check.log"].splitlines() if line.startswith('{"healthz"')]
    assert check, logs["check.log"]
    assert check[-1]["healthz"]["policy_version"] >= 2
    assert check[-1]["completion_version"] >= 2
