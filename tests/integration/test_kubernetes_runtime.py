"""The ``kubernetes`` runtime against a real cluster: runs only when ``KUBECONFIG`` is set (see infra/k8s/README.md).

The kubeconfig's identity needs the Role of ``infra/k8s/episode-runtime-rbac.yaml`` in the test namespace.
Settings (environment):

- ``ORCHARD_K8S_TEST_NAMESPACE``: namespace of the episode pods (default ``orchard``);
- ``ORCHARD_K8S_TEST_IMAGE``: task image with sh, coreutils, GNU find and tar (default ``python:3.12-slim``);
- ``ORCHARD_K8S_TEST_NETPOL=1``: also check that the NetworkPolicy blocks egress (needs a CNI that enforces
  NetworkPolicies, e.g. Calico or Cilium; kindnet and plain flannel ignore them).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator

import pytest

from orchard.env.exceptions import SandboxNotFoundError
from orchard.env.k8s_objects import KubernetesRuntimeConfig, ProxyEgress, pod_name
from orchard.env.kubernetes_runtime import KubernetesRuntime, KubernetesSandbox
from orchard.sandbox import FileEntry, Limits, SandboxSpec

pytestmark = [
    pytest.mark.kubernetes,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a Kubernetes cluster: set KUBECONFIG"),
    pytest.mark.timeout(600),
]


@pytest.fixture
def runtime() -> KubernetesRuntime:
    config = KubernetesRuntimeConfig(
        namespace=os.environ.get("ORCHARD_K8S_TEST_NAMESPACE", "orchard"),
        default_image=os.environ.get("ORCHARD_K8S_TEST_IMAGE", "python:3.12-slim"),
        proxy=ProxyEgress(port=8000, pod_selector={"app.kubernetes.io/name": "orchard-proxy"}),
    )
    return KubernetesRuntime(config)


@pytest.fixture
def sandbox(runtime: KubernetesRuntime) -> Iterator[KubernetesSandbox]:
    spec = SandboxSpec(
        sandbox_id=f"it-{secrets.token_hex(4)}",
        run_id="integration/test",
        episode_id=f"ep-{secrets.token_hex(2)}",
        task_id="echo",
        limits=Limits(cpus=0.25, memory_mb=256, disk_mb=256),
        ttl_s=600,
        env={"OPENAI_API_KEY": "tok-integration", "GREETING": "hello"},
        proxy_url="http://orchard-proxy:8000/v1",
    )
    created = runtime.create(spec)
    try:
        yield created
    finally:
        runtime.delete(spec.sandbox_id)


def test_an_episode_pod_runs_commands_holds_files_and_is_deleted(
    runtime: KubernetesRuntime, sandbox: KubernetesSandbox
) -> None:
    sandbox_id = sandbox.spec.sandbox_id
    result = sandbox.exec('echo "$GREETING" "$OPENAI_API_KEY" "$OPENAI_BASE_URL" "$(id -u)" "$(pwd)"')
    assert (result.exit_code, result.stdout, result.timed_out) == (
        0,
        "hello tok-integration http://orchard-proxy:8000/v1 1000 /workspace\n",
        False,
    )
    sandbox.write_file("src/a.txt", b"content\n")
    assert sandbox.read_file("src/a.txt") == b"content\n"
    assert sandbox.list_files("src") == [FileEntry(path="src/a.txt", kind="file", size=8)]
    assert sandbox.exec("touch /etc/x").exit_code != 0  # read-only root filesystem
    assert sandbox.exec("sleep 60", timeout_s=1).timed_out
    sandbox.heartbeat()
    assert runtime.get(sandbox_id).spec.sandbox_id == sandbox_id
    assert sandbox_id in [listed.spec.sandbox_id for listed in runtime.list()]

    runtime.delete(sandbox_id)
    with pytest.raises(SandboxNotFoundError):
        runtime.get(sandbox_id)
    _wait_gone(runtime, sandbox_id)


@pytest.mark.skipif(not os.environ.get("ORCHARD_K8S_TEST_NETPOL"), reason="set ORCHARD_K8S_TEST_NETPOL=1")
def test_the_network_policy_blocks_egress_other_than_the_proxy(sandbox: KubernetesSandbox) -> None:
    probe = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 443), timeout=5)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('blocked', type(exc).__name__)\n"
    )
    result = sandbox.exec(["python3", "-c", probe], timeout_s=30)
    assert result.stdout.startswith("blocked"), result


def _wait_gone(runtime: KubernetesRuntime, sandbox_id: str, timeout_s: float = 120.0) -> None:
    """The pod object disappears once the kubelet has stopped it (the policy and Secret follow it)."""
    core = runtime._core
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(
            runtime.config.namespace, field_selector=f"metadata.name={pod_name(sandbox_id, runtime.config)}"
        ).items
        if not pods:
            return
        time.sleep(1)
    raise AssertionError(f"pod of {sandbox_id} still present after {timeout_s} s")
