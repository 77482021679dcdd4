"""The ``kubernetes`` runtime against a real API server: the local control plane (etcd, kube-apiserver, scheduler,
controller manager, kwok nodes; ``infra/local/kubernetes``) started by the shared fixture, or the cluster of
``$ORCHARD_K8S_TEST_KUBECONFIG``.

On the local control plane the pods are kwok's: the API objects, scheduling, the phases, garbage collection,
quotas and exec through the API server are all real, but kwok runs an exec's command on this host, so the runtime
works with ``node_exec_root`` (a directory per sandbox) and what only a container provides (its user, its
read-only root, the pod's environment applied by a kubelet) is checked on an external cluster alone.

Settings for an external cluster (environment): ``ORCHARD_K8S_TEST_NAMESPACE`` (default ``orchard``; its identity
needs the Role of ``infra/k8s/episode-runtime-rbac.yaml``), ``ORCHARD_K8S_TEST_IMAGE`` (default ``python:3.12-slim``),
``ORCHARD_K8S_TEST_NETPOL=1`` (also check that the NetworkPolicy blocks egress; needs a CNI that enforces it).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from orchard.sandbox import Limits, SandboxSpec
from orchard.sandbox.exceptions import SandboxNotFoundError
from orchard.sandbox.kubernetes.objects import KubernetesRuntimeConfig, ProxyEgress, pod_name, secret_name
from orchard.sandbox.kubernetes.runtime import (
    KubernetesRuntime,
    KubernetesRuntimeError,
    KubernetesSandbox,
    KubernetesStartError,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(900)]

PROXY_URL = "http://orchard-proxy:8000/v1"
UNPULLABLE_IMAGE = "orchard.invalid/unpullable:latest"  # infra/local/kubernetes/cluster.py's kwok stage fails it


@pytest.fixture(scope="module")
def api(kubernetes_target: Any) -> client.ApiClient:
    """An admin client of the cluster under test."""
    return kube_config.new_client_from_config(config_file=str(kubernetes_target.kubeconfig))


@pytest.fixture(scope="module")
def namespace(api: client.ApiClient, kubernetes_target: Any) -> Iterator[str]:
    """A fresh namespace on the local control plane (deleted after the module); the configured one elsewhere."""
    if not kubernetes_target.local:
        yield os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard")
        return
    name = f"orchard-it-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    _wait_for(lambda: _exists(core.read_namespaced_service_account, "default", name), 60, "default ServiceAccount")
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def make_runtime(
    api: client.ApiClient,
    namespace: str,
    kubernetes_target: Any,
    tmp_path: Path,
) -> Iterator[Callable[..., KubernetesRuntime]]:
    """``make_runtime(**config_overrides)``: a runtime on the cluster under test; its sandboxes go after the test."""
    made: list[KubernetesRuntime] = []

    def make(**overrides: object) -> KubernetesRuntime:
        settings: dict[str, object] = {
            "namespace": namespace,
            "default_image": os.environ.get("ORCHARD_K8S_TEST_IMAGE", "python:3.12-slim"),
            "proxy": ProxyEgress(port=8000, pod_selector={"app.kubernetes.io/name": "orchard-proxy"}),
            "start_timeout_s": 60.0,
        }
        if kubernetes_target.local:
            settings["node_exec_root"] = str(tmp_path / "nodes")
        runtime = KubernetesRuntime(KubernetesRuntimeConfig(**{**settings, **overrides}), api_client=api)
        made.append(runtime)
        return runtime

    try:
        yield make
    finally:
        for runtime in made:
            runtime.close()


def episode_spec(**overrides: object) -> SandboxSpec:
    """An episode's sandbox spec with a unique id."""
    settings: dict[str, object] = {
        "sandbox_id": f"it-{secrets.token_hex(4)}",
        "run_id": "integration/test",
        "episode_id": f"ep-{secrets.token_hex(2)}",
        "task_id": "echo",
        "limits": Limits(cpus=0.25, memory_mb=256, disk_mb=256),
        "ttl_s": 600,
        "env": {"OPENAI_API_KEY": "tok-integration", "GREETING": "hello"},
        "proxy_url": PROXY_URL,
    }
    return SandboxSpec(**{**settings, **overrides})  # type: ignore[arg-type]


@pytest.fixture
def runtime(make_runtime: Callable[..., KubernetesRuntime]) -> KubernetesRuntime:
    """A runtime with the default test settings."""
    return make_runtime()


@pytest.fixture
def sandbox(runtime: KubernetesRuntime) -> Iterator[KubernetesSandbox]:
    """One running episode sandbox."""
    spec = episode_spec()
    created = runtime.create(spec)
    try:
        yield created
    finally:
        runtime.delete(spec.sandbox_id)


def test_an_episode_pod_runs_commands_with_its_environment_and_exit_status(sandbox: KubernetesSandbox) -> None:
    workdir = sandbox.info().workdir
    result = sandbox.exec('echo "$GREETING" "$OPENAI_API_KEY" "$OPENAI_BASE_URL" "$(pwd)"; echo err >&2')
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        0,
        f"hello tok-integration {PROXY_URL} {workdir}\n",
        "err\n",
        False,
    )
    assert sandbox.exec("exit 3").exit_code == 3
    assert sandbox.exec(["sh", "-c", "exit 42"]).exit_code == 42
    assert sandbox.exec("cat", stdin=b"piped in\n").stdout == "piped in\n"
    timed_out = sandbox.exec("sleep 60", timeout_s=1)
    assert (timed_out.timed_out, timed_out.exit_code) == (True, None)


def test_a_sandbox_found_again_by_id_runs_commands_with_the_pods_environment(
    runtime: KubernetesRuntime, sandbox: KubernetesSandbox
) -> None:
    """What the Env API does on every request: ``get`` the sandbox, then exec (the secret key through its Secret)."""
    again = runtime.get(sandbox.spec.sandbox_id)
    result = again.exec('echo "$GREETING" "$OPENAI_API_KEY" "$OPENAI_BASE_URL"')
    assert (result.exit_code, result.stdout) == (0, f"hello tok-integration {PROXY_URL}\n")


def test_an_episode_pod_holds_files(sandbox: KubernetesSandbox) -> None:
    sandbox.write_file("src/a.txt", b"content\n")
    sandbox.write_file("src/deep/b.sh", b"#!/bin/sh\n", mode=0o755)
    assert sandbox.read_file("src/a.txt") == b"content\n"
    listing = sandbox.list_files("src", recursive=True)
    assert [(entry.path, entry.kind) for entry in listing] == [
        ("src/a.txt", "file"),
        ("src/deep", "dir"),
        ("src/deep/b.sh", "file"),
    ]
    assert (listing[0].size, listing[2].size) == (8, 10)
    assert sandbox.exec("ls -l src/deep/b.sh | cut -c1-10").stdout == "-rwxr-xr-x\n"
    sandbox.delete_file("src/deep")
    assert [entry.path for entry in sandbox.list_files("src")] == ["src/a.txt"]


def test_create_uploads_the_task_directory_without_its_history_and_patches_apply(
    runtime: KubernetesRuntime, tmp_path: Path
) -> None:
    task = tmp_path / "task"
    (task / ".git").mkdir(parents=True)
    (task / ".git" / "HEAD").write_text("ref: refs/heads/future\n")
    (task / "pkg").mkdir()
    (task / "pkg" / "mod.py").write_text("VALUE = 1\n")
    spec = episode_spec(source_dir=task, git_snapshot=True)
    sandbox = runtime.create(spec)
    assert sandbox.read_file("pkg/mod.py") == b"VALUE = 1\n"
    log = sandbox.exec("git log --format=%s && git status --porcelain")
    assert (log.exit_code, log.stdout) == (0, "task\n")
    patch = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n"
    applied = sandbox.apply_patch(patch)
    assert (applied.exit_code, sandbox.read_file("pkg/mod.py")) == (0, b"VALUE = 2\n"), applied
    assert sandbox.apply_patch(patch).exit_code != 0  # applied already: refused, the file left as it is
    assert sandbox.read_file("pkg/mod.py") == b"VALUE = 2\n"


def test_a_terminal_in_the_pod_runs_an_interactive_shell(sandbox: KubernetesSandbox) -> None:
    terminal = sandbox.open_pty(cols=100, rows=30)
    try:
        terminal.write(b"echo pty-$((6 * 7)); stty size; exit 5\n")
        output = b""
        deadline = time.monotonic() + 30
        while b"pty-42" not in output or b"30 100" not in output:
            chunk = terminal.read(timeout_s=1)
            assert chunk != b"", output
            output += chunk or b""
            assert time.monotonic() < deadline, output
        assert terminal.wait(timeout_s=30) == 5
    finally:
        terminal.close()


def test_heartbeat_get_list_and_delete_with_garbage_collection(
    runtime: KubernetesRuntime, sandbox: KubernetesSandbox, api: client.ApiClient
) -> None:
    sandbox_id = sandbox.spec.sandbox_id
    before = sandbox.expires_at
    time.sleep(0.05)
    sandbox.heartbeat()
    assert sandbox.expires_at is not None and before is not None and sandbox.expires_at > before
    assert runtime.get(sandbox_id).expires_at == pytest.approx(sandbox.expires_at, abs=0.01)
    assert sandbox_id in [listed.spec.sandbox_id for listed in runtime.list()]

    core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
    ns, pod = runtime.config.namespace, pod_name(sandbox_id, runtime.config)
    policy = net.list_namespaced_network_policy(ns, label_selector=f"orchard.dev/sandbox={sandbox_id}").items
    assert [p.metadata.owner_references[0].name for p in policy] == [pod]
    runtime.delete(sandbox_id)
    with pytest.raises(SandboxNotFoundError):
        runtime.get(sandbox_id)
    _wait_for(lambda: not _exists(core.read_namespaced_pod, pod, ns), 120, f"pod {pod} gone")
    _wait_for(
        lambda: not _exists(core.read_namespaced_secret, secret_name(sandbox_id, runtime.config), ns), 60, "secret"
    )
    _wait_for(
        lambda: not net.list_namespaced_network_policy(ns, label_selector=f"orchard.dev/sandbox={sandbox_id}").items,
        120,
        "network policy collected by the garbage collector",
    )


def test_an_expired_sandbox_is_reaped(make_runtime: Callable[..., KubernetesRuntime]) -> None:
    now = [time.time()]
    runtime = make_runtime()
    runtime._clock = lambda: now[0]
    spec = episode_spec(ttl_s=30)
    runtime.create(spec)
    assert runtime.reap_expired() == []
    now[0] += 31
    assert runtime.reap_expired() == [spec.sandbox_id]
    with pytest.raises(SandboxNotFoundError):
        runtime.get(spec.sandbox_id)


def test_a_full_quota_fails_create_clearly_and_leaves_nothing_behind(
    runtime: KubernetesRuntime,
    api: client.ApiClient,
    kubernetes_target: Any,
) -> None:
    if not kubernetes_target.local:
        pytest.skip("creates a ResourceQuota: only on the local control plane")
    core, ns = client.CoreV1Api(api), runtime.config.namespace
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="no-pods"), spec={"hard": {"pods": "0"}})
    core.create_namespaced_resource_quota(ns, quota)
    try:
        _wait_for(lambda: core.read_namespaced_resource_quota("no-pods", ns).status.hard is not None, 30, "quota")
        spec = episode_spec()
        with pytest.raises(KubernetesStartError, match="exceeded quota"):
            runtime.create(spec)
        assert not _exists(core.read_namespaced_secret, secret_name(spec.sandbox_id, runtime.config), ns)
        assert (
            not client.NetworkingV1Api(api)
            .list_namespaced_network_policy(ns, label_selector=f"orchard.dev/sandbox={spec.sandbox_id}")
            .items
        )
    finally:
        core.delete_namespaced_resource_quota("no-pods", ns)


def test_a_pod_deleted_under_the_runtime_is_gone_for_it(
    runtime: KubernetesRuntime, sandbox: KubernetesSandbox, api: client.ApiClient
) -> None:
    core, ns = client.CoreV1Api(api), runtime.config.namespace
    core.delete_namespaced_pod(sandbox.pod_name, ns, grace_period_seconds=0)
    _wait_for(lambda: not _exists(core.read_namespaced_pod, sandbox.pod_name, ns), 60, "pod gone")
    with pytest.raises(SandboxNotFoundError):
        runtime.get(sandbox.spec.sandbox_id)
    with pytest.raises(KubernetesRuntimeError):
        sandbox.exec("true")
    runtime.delete(sandbox.spec.sandbox_id)  # idempotent: nothing left to delete is no error


def test_an_image_that_cannot_be_pulled_fails_create_at_once_and_leaves_nothing(
    runtime: KubernetesRuntime, api: client.ApiClient
) -> None:
    """kwok reports ErrImagePull for this image (a stage of the local control plane); a real registry refuses it."""
    core, ns = client.CoreV1Api(api), runtime.config.namespace
    spec = episode_spec(image=UNPULLABLE_IMAGE)
    started = time.monotonic()
    with pytest.raises(KubernetesStartError, match="ErrImagePull"):
        runtime.create(spec)
    assert time.monotonic() - started < runtime.config.start_timeout_s / 2
    assert not _exists(core.read_namespaced_secret, secret_name(spec.sandbox_id, runtime.config), ns)
    _wait_for(lambda: not _exists(core.read_namespaced_pod, pod_name(spec.sandbox_id, runtime.config), ns), 60, "pod")


def test_a_sandbox_rides_out_an_api_server_restart(
    runtime: KubernetesRuntime, sandbox: KubernetesSandbox, kubernetes_target: Any
) -> None:
    """While the API server is down an operation fails with the runtime's own error (no hang, no stray exception
    type); once it is back the same sandbox object works on, its files intact."""
    if not kubernetes_target.local:
        pytest.skip("restarts the API server: only on the local control plane")
    sandbox.write_file("state.txt", b"before\n")
    control_plane = kubernetes_target.control_plane
    control_plane.stop_component("kube-apiserver", timeout_s=5)  # a crash, not a graceful drain
    try:
        with pytest.raises(KubernetesRuntimeError):
            sandbox.exec("true", timeout_s=5)
        with pytest.raises(KubernetesRuntimeError):
            sandbox.heartbeat()
    finally:
        control_plane.restart("kube-apiserver")
    assert sandbox.read_file("state.txt") == b"before\n"
    assert sandbox.exec("echo after").stdout == "after\n"
    sandbox.heartbeat()
    assert runtime.get(sandbox.spec.sandbox_id).spec.sandbox_id == sandbox.spec.sandbox_id


def test_the_pod_runs_unprivileged_read_only_and_isolated_by_its_policy(
    runtime: KubernetesRuntime,
    sandbox: KubernetesSandbox,
    api: client.ApiClient,
    kubernetes_target: Any,
) -> None:
    """What the API server stored (it validated and defaulted it); on a real kubelet, also what the process sees."""
    ns = runtime.config.namespace
    pod = client.CoreV1Api(api).read_namespaced_pod(sandbox.pod_name, ns)
    context = pod.spec.containers[0].security_context
    assert (pod.spec.security_context.run_as_user, pod.spec.security_context.run_as_non_root) == (1000, True)
    assert (context.read_only_root_filesystem, context.allow_privilege_escalation, context.capabilities.drop) == (
        True,
        False,
        ["ALL"],
    )
    assert pod.spec.automount_service_account_token is False
    policy = (
        client.NetworkingV1Api(api)
        .list_namespaced_network_policy(ns, label_selector=f"orchard.dev/sandbox={sandbox.spec.sandbox_id}")
        .items[0]
    )
    assert policy.spec.policy_types == ["Ingress", "Egress"]
    assert policy.spec.ingress in (None, [])
    egress_ports = sorted(port.port for rule in policy.spec.egress for port in rule.ports or [])
    assert egress_ports == [53, 53, 8000]
    if kubernetes_target.local:
        return  # kwok runs execs on this host, as root: no container to look into
    result = sandbox.exec('echo "$(id -u)" "$(pwd)"')
    assert (result.exit_code, result.stdout) == (0, "1000 /workspace\n")
    assert sandbox.exec("touch /etc/x").exit_code != 0
    if os.environ.get("ORCHARD_K8S_TEST_NETPOL"):  # needs a CNI that enforces NetworkPolicies
        probe = "import socket; socket.create_connection(('1.1.1.1', 443), timeout=5)"
        assert sandbox.exec(["python3", "-c", probe], timeout_s=30).exit_code != 0


def _exists(read: Callable[..., object], name: str, namespace: str) -> bool:
    try:
        read(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _wait_for(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)
