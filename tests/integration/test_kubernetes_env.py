"""Orchard Env on a real API server, as a user deploys it: ``orchard env serve --runtime kubernetes`` under the
``orchard-env`` ServiceAccount and Role that ``infra/k8s/episode-runtime-rbac.yaml`` ships (a token of that account,
nothing more), running file-lookup demonstrations through the recording proxy, the built-in harness and the grader,
with outcomes and model calls on the bus; and, with a Role narrower than that, refusing to start and naming what it
lacks.

The cluster is the local control plane of the shared fixture (kwok nodes: execs run on this host, in a working
copy per sandbox under ``node_exec_root``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.topics import MODEL_CALLS, OUTCOMES

pytestmark = [pytest.mark.kubernetes, pytest.mark.harness, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
ORCHARD = str(Path(sys.executable).parent / "orchard")
RBAC = REPO / "infra" / "k8s" / "episode-runtime-rbac.yaml"
EXPECTED = {  # demonstration kind -> outcome status, reward
    "perfect": ("SUCCEEDED", 1.0),
    "wrong_file_first": ("SUCCEEDED", 1.0),
    "wrong_key": ("FAILED", 0.0),
    "wrong_file": ("FAILED", 0.0),
    "no_read": ("FAILED", 0.0),
    "no_answer": ("FAILED", 0.0),
}


@pytest.fixture
def admin(kubernetes_target: Any) -> client.ApiClient:
    """An admin client of the local control plane."""
    if not kubernetes_target.local:
        pytest.skip("installs RBAC objects: only on the local control plane")
    return kube_config.new_client_from_config(config_file=str(kubernetes_target.kubeconfig))


@pytest.fixture
def namespace(admin: client.ApiClient) -> Iterator[str]:
    """A fresh namespace for the test's episode pods."""
    core = client.CoreV1Api(admin)
    name = f"orchard-env-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


def install_rbac(admin: client.ApiClient, namespace: str, drop: tuple[str, ...] = ()) -> None:
    """The shipped ServiceAccount, Role and RoleBinding in ``namespace``, the Role without the resources ``drop``."""
    rbac = client.RbacAuthorizationV1Api(admin)
    for body in yaml.safe_load_all(RBAC.read_text()):
        body["metadata"]["namespace"] = namespace
        if body["kind"] == "ServiceAccount":
            client.CoreV1Api(admin).create_namespaced_service_account(namespace, body)
        elif body["kind"] == "Role":
            body["rules"] = [rule for rule in body["rules"] if not set(rule["resources"]) & set(drop)]
            rbac.create_namespaced_role(namespace, body)
        else:
            for subject in body["subjects"]:
                subject["namespace"] = namespace
            rbac.create_namespaced_role_binding(namespace, body)


def service_account_kubeconfig(admin: client.ApiClient, namespace: str, admin_kubeconfig: Path, out: Path) -> Path:
    """A kubeconfig holding a one-hour token of ``orchard-env`` (TokenRequest) and nothing else."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))
    token = client.CoreV1Api(admin).create_namespaced_service_account_token("orchard-env", namespace, request)
    cluster = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "orchard-env", "user": {"token": token.status.token}}],
        "contexts": [{"name": "env", "context": {"cluster": cluster["name"], "user": "orchard-env"}}],
        "current-context": "env",
    }
    out.write_text(json.dumps(config))
    return out


def runtime_config(namespace: str, work: Path) -> Path:
    """The ``KubernetesRuntimeConfig`` file ``orchard env serve --runtime-config`` reads."""
    path = work / "runtime.yaml"
    settings = {
        "type": "kubernetes",
        "namespace": namespace,
        "default_image": "orchard/file-lookup:1",
        "proxy": {"port": 8000, "pod_selector": {"app.kubernetes.io/name": "orchard-proxy"}},
        "node_exec_root": str(work / "nodes"),
        "start_timeout_s": 60,
    }
    path.write_text(yaml.safe_dump(settings))
    return path


def free_port() -> int:
    """A port free on loopback now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Processes:
    """The test's server processes, each logging to a file; all stopped at the end."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env, self.running = work, env, {}

    def start(self, name: str, command: list[str], extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.work / f"{name}.log").open("wb")
        self.running[name] = subprocess.Popen(  # noqa: S603 - fixed commands
            command, cwd=REPO, env={**self.env, **(extra or {})}, stdout=log, stderr=subprocess.STDOUT
        )
        return self.running[name]

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for process in reversed(self.running.values()):
            if process.poll() is None:
                process.terminate()
        for process in self.running.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Component processes on an embedded bus under ``tmp_path``, with the Env's and the proxy's secrets."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHARD_BUS__", "ORCHARD_STORE__", "KUBECONFIG"))}
    env |= {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ORCHARD_RUN_ID": "k8s-env",
        "ORCHARD_BUS__TYPE": "embedded",
        "ORCHARD_BUS__PATH": str(tmp_path / "bus"),
        "ORCHARD_STORE__TYPE": "local",
        "ORCHARD_STORE__PATH": str(tmp_path / "store"),
        "ORCHARD_PROXY_ADMIN_TOKEN": secrets.token_urlsafe(16),
        "ORCHARD_ENV_TOKEN": secrets.token_urlsafe(16),
    }
    running = Processes(tmp_path, env)
    try:
        yield running
    finally:
        running.stop()


def wait_answers(url: str, process: subprocess.Popen[bytes], processes: Processes, name: str) -> None:
    """Until ``url`` answers 200; fails with the log when the process exits first or after 90 s."""
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None, (f"{name} exited {process.returncode}", processes.log(name))
        assert time.monotonic() < deadline, (f"{name} did not answer", processes.log(name))
        time.sleep(0.3)


def read_topic(bus_path: Path, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic`` on the embedded bus, decoded."""
    bus = open_bus(EmbeddedBusConfig(path=bus_path))
    codec, out = Codec.default(), []
    try:
        reader = bus.consumer([topic])
        while batch := reader.poll(max_records=500, timeout_s=0.3):
            out.extend(codec.decode(record.value).record for record in batch)
    finally:
        bus.close()
    return out


def env_credentials_and_tasks(
    admin: client.ApiClient, namespace: str, target: Any, work: Path, train_tasks: int, drop: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """The shipped RBAC (less ``drop``) in ``namespace``, a kubeconfig of its ServiceAccount, generated tasks."""
    install_rbac(admin, namespace, drop)
    kubeconfig = service_account_kubeconfig(admin, namespace, target.kubeconfig, work / "env.kubeconfig")
    tasks = work / "tasks"
    generate = [sys.executable, "-m", "recipes.file_lookup.generate", str(tasks), "--train-tasks", str(train_tasks)]
    subprocess.run([*generate, "--eval-tasks", "1"], cwd=REPO, check=True, capture_output=True)
    return kubeconfig, tasks


def test_env_serve_on_kubernetes_runs_graded_episodes_under_the_shipped_role(
    admin: client.ApiClient,
    namespace: str,
    processes: Processes,
    kubernetes_target: Any,
    tmp_path: Path,
) -> None:
    kubeconfig, tasks = env_credentials_and_tasks(admin, namespace, kubernetes_target, tmp_path, train_tasks=6)
    demos = tmp_path / "demos"
    plan = ["plan", str(tasks / "train"), str(demos), "--imperfect-fraction", "0.5", "--seed", "3"]
    subprocess.run(
        [sys.executable, "-m", "recipes.file_lookup.expert", *plan], cwd=REPO, check=True, capture_output=True
    )
    subprocess.run([ORCHARD, "topics", "create"], cwd=REPO, env=processes.env, check=True, capture_output=True)
    env_kubeconfig = {"KUBECONFIG": str(kubeconfig)}
    ports = {name: free_port() for name in ("expert", "proxy", "env")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    commands = {
        "expert": ([sys.executable, "-m", "recipes.file_lookup.expert", "serve", str(demos), "--port",
                    str(ports["expert"]), "--tokenizer", "tiny"], "/v1/models", None),
        "proxy": ([ORCHARD, "proxy", "serve", "--backend", f"{urls['expert']}/v1", "--port", str(ports["proxy"])],
                  "/healthz", None),
        "env": ([ORCHARD, "env", "serve", "--tasks", str(tasks / "train"), "--proxy", urls["proxy"], "--port",
                 str(ports["env"]), "--concurrency", "3", "--timeout", "120", "--runtime", "kubernetes",
                 "--runtime-config", str(runtime_config(namespace, tmp_path))], "/healthz", env_kubeconfig),
    }  # fmt: skip
    for name, (command, health, extra) in commands.items():
        wait_answers(urls[name] + health, processes.start(name, command, extra), processes, name)

    rollout = subprocess.run(  # noqa: S603 - fixed command
        [ORCHARD, "rollout", "run", "--env", urls["env"], "--tasks", str(tasks / "train"), "--demos", str(demos),
         "--model", "file-lookup-expert", "--wait-timeout", "240"],
        cwd=REPO, env=processes.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert rollout.returncode == 0, (rollout.stdout[-2000:], rollout.stderr[-3000:], processes.log("env"))

    kinds = {line["episode_id"]: line["kind"] for line in map(json.loads, (demos / "demonstrations.jsonl").open())}
    outcomes = {o["episode_id"]: o for o in read_topic(tmp_path / "bus", OUTCOMES)}
    assert {e: (o["status"], o["reward"]) for e, o in outcomes.items()} == {e: EXPECTED[k] for e, k in kinds.items()}
    assert {k for k in kinds.values()} >= {"perfect"}
    calls: dict[str, int] = {}
    for call in read_topic(tmp_path / "bus", MODEL_CALLS):
        calls[call["episode_id"]] = calls.get(call["episode_id"], 0) + 1
    assert calls == {episode: outcome["num_model_calls"] for episode, outcome in outcomes.items()}
    pods = client.CoreV1Api(admin).list_namespaced_pod(namespace).items
    assert [pod.metadata.name for pod in pods if pod.metadata.deletion_timestamp is None] == []


def test_env_serve_on_kubernetes_refuses_to_start_with_a_narrower_role_naming_what_it_lacks(
    admin: client.ApiClient,
    namespace: str,
    processes: Processes,
    kubernetes_target: Any,
    tmp_path: Path,
) -> None:
    drop = ("pods/exec", "networkpolicies")
    kubeconfig, tasks = env_credentials_and_tasks(admin, namespace, kubernetes_target, tmp_path, 1, drop)
    command = [ORCHARD, "env", "serve", "--tasks", str(tasks / "train"), "--proxy", "http://127.0.0.1:9",
               "--port", str(free_port()), "--runtime", "kubernetes",
               "--runtime-config", str(runtime_config(namespace, tmp_path))]  # fmt: skip
    done = subprocess.run(  # noqa: S603 - fixed command
        command, cwd=REPO, env={**processes.env, "KUBECONFIG": str(kubeconfig)}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    output = " ".join((done.stdout + done.stderr).split())  # the console wraps long lines
    assert done.returncode != 0, output
    assert f"lack rights the runtime needs in namespace {namespace!r}" in output, output
    lacking = output.split("needs in namespace", 1)[1]
    for right in ("create pods/exec", "create networkpolicies (networking.k8s.io)", "delete networkpolicies"):
        assert right in lacking, output
    assert "create pods," not in lacking and "create secrets" not in lacking, output
