"""Episode sandboxes at scale on a real API server: N sandboxes created through Orchard's ``kubernetes`` runtime
(each its Secret, NetworkPolicy and Pod, owner references patched, waited until Running) beside N bare pods created
with the raw ``kubernetes`` client and watched until Running, same cluster, same run.

It prints, for both paths: time until all are ready, creates per second, API requests per sandbox (counted in the
client), then the time until all are deleted and gone; and the control plane's memory (resident set of etcd,
kube-apiserver, scheduler, controller manager and kwok). Orchard Env's published figure is 1,000 sandboxes in 26 s
on a real cluster.

Starts the local control plane ``bench-kubernetes`` (``infra/local/kubernetes/cluster.py``: kwok nodes, so pods
reach Running without containers; the first start builds the binaries) unless ``KUBECONFIG`` is set.

    python benchmarks/k8s_scale.py [--sandboxes 1000] [--threads 32] [--skip-bare]
"""
# ruff: noqa: E402, T201  (a script: its own folder leaves sys.path first; it prints its report)

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import importlib.util
import os
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kubernetes import client, watch
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from orchard.sandbox import Limits, SandboxSpec
from orchard.sandbox.kubernetes.objects import KubernetesRuntimeConfig, ProxyEgress
from orchard.sandbox.kubernetes.runtime import KubernetesRuntime

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_NAME = "bench-kubernetes"
IMAGE = "orchard/bench-task:1"


@dataclass
class PathResult:
    """One path's figures."""

    name: str
    sandboxes: int
    ready_s: float
    requests: int
    delete_s: float

    @property
    def creates_per_s(self) -> float:
        """Sandboxes ready per second."""
        return self.sandboxes / self.ready_s


class CountingApiClient(client.ApiClient):
    """An ``ApiClient`` that counts the HTTP requests it makes."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.requests = 0
        self._lock = threading.Lock()

    def call_api(self, *args: Any, **kwargs: Any) -> Any:
        """Count, then make the request."""
        with self._lock:
            self.requests += 1
        return super().call_api(*args, **kwargs)


def load_cluster_module() -> ModuleType:
    """``infra/local/kubernetes/cluster.py``, loaded by path."""
    path = REPO_ROOT / "infra" / "local" / "kubernetes" / "cluster.py"
    spec = importlib.util.spec_from_file_location("orchard_local_kubernetes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def counting_client(kubeconfig: str, threads: int) -> CountingApiClient:
    """A counting client from ``kubeconfig`` with a connection pool for ``threads`` threads."""
    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    configuration.connection_pool_maxsize = threads * 2
    return CountingApiClient(configuration)


def make_namespace(api: client.ApiClient) -> str:
    """A fresh namespace, once its ``default`` ServiceAccount exists."""
    name = f"scale-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except ApiException:
            time.sleep(0.2)
    raise RuntimeError(f"namespace {name} got no default ServiceAccount")


def wait_empty(core: client.CoreV1Api, namespace: str, timeout_s: float = 600) -> None:
    """Until no pod is left in ``namespace``."""
    deadline = time.monotonic() + timeout_s
    while core.list_namespaced_pod(namespace, limit=1).items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} not gone after {timeout_s} s")
        time.sleep(0.5)


def run_orchard(kubeconfig: str, sandboxes: int, threads: int) -> PathResult:
    """N sandboxes through ``KubernetesRuntime.create``, then ``delete``, from a thread pool."""
    api = counting_client(kubeconfig, threads)
    namespace = make_namespace(api)
    config = KubernetesRuntimeConfig(
        namespace=namespace,
        default_image=IMAGE,
        proxy=ProxyEgress(port=8000, pod_selector={"app.kubernetes.io/name": "orchard-proxy"}),
        poll_interval_s=0.2,
        start_timeout_s=600,
    )
    runtime = KubernetesRuntime(config, api_client=api)
    specs = [
        SandboxSpec(
            sandbox_id=f"s{index:05d}-{secrets.token_hex(2)}",
            run_id="scale",
            episode_id=f"e{index}",
            task_id="bench",
            limits=Limits(cpus=0.1, memory_mb=64, disk_mb=64),
            env={"OPENAI_API_KEY": "tok"},
            proxy_url="http://orchard-proxy:8000/v1",
        )
        for index in range(sandboxes)
    ]
    api.requests = 0
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(progress(pool.map(runtime.create, specs), sandboxes, "orchard: ready"))
    ready_s = time.perf_counter() - started
    requests = api.requests
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(runtime.delete, [spec.sandbox_id for spec in specs]))
    wait_empty(client.CoreV1Api(api), namespace)
    delete_s = time.perf_counter() - started
    client.CoreV1Api(api).delete_namespace(namespace)
    return PathResult(
        "Orchard runtime (Secret + NetworkPolicy + Pod, waited Running)", sandboxes, ready_s, requests, delete_s
    )


def run_bare(kubeconfig: str, sandboxes: int, threads: int) -> PathResult:
    """N plain pods created with the raw client, Running seen through one watch; then deleted."""
    api = counting_client(kubeconfig, threads)
    namespace = make_namespace(api)
    core = client.CoreV1Api(api)

    def pod(index: int) -> client.V1Pod:
        container = client.V1Container(name="task", image=IMAGE, command=["sleep", "infinity"])
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"bare-{index:05d}"), spec=client.V1PodSpec(containers=[container])
        )

    running: set[str] = set()
    done = threading.Event()

    def watch_running() -> None:
        stream = watch.Watch()
        for event in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=600):
            obj = event["object"]
            if obj.status is not None and obj.status.phase == "Running":
                running.add(obj.metadata.name)
                if len(running) >= sandboxes:
                    done.set()
                    stream.stop()

    watcher = threading.Thread(target=watch_running, daemon=True)
    watcher.start()
    api.requests = 0
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda index: core.create_namespaced_pod(namespace, pod(index)), range(sandboxes)))
    done.wait(600)
    ready_s = time.perf_counter() - started
    requests = api.requests
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda index: core.delete_namespaced_pod(f"bare-{index:05d}", namespace), range(sandboxes)))
    wait_empty(core, namespace)
    delete_s = time.perf_counter() - started
    core.delete_namespace(namespace)
    return PathResult("raw client: plain pods, one watch", sandboxes, ready_s, requests, delete_s)


def progress(items: Any, total: int, label: str) -> Any:
    """Pass items through, printing a line every tenth of ``total``."""
    step = max(1, total // 10)
    started = time.perf_counter()
    for count, item in enumerate(items, 1):
        if count % step == 0:
            print(f"  {label}: {count}/{total} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
        yield item


def rss_mb(pids: dict[str, int | None]) -> dict[str, float]:
    """Resident memory of each live process, MiB."""
    sizes = {}
    for name, pid in pids.items():
        if pid is None:
            continue
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes[name] = int(line.split()[1]) / 1024
    return sizes


def report(results: list[PathResult], memory: dict[str, float] | None) -> None:
    """The side-by-side table, ratios against the bare path."""
    print(f"\n{'path':<64} {'ready s':>8} {'creates/s':>10} {'req/sandbox':>12} {'delete s':>9}")
    for result in results:
        print(
            f"{result.name:<64} {result.ready_s:>8.1f} {result.creates_per_s:>10.1f} "
            f"{result.requests / result.sandboxes:>12.1f} {result.delete_s:>9.1f}"
        )
    if len(results) == 2:
        ours, bare = results
        ready, delete = ours.ready_s / bare.ready_s, ours.delete_s / bare.delete_s
        print(f"orchard / bare: ready time x{ready:.2f}, delete time x{delete:.2f}")
    print(f"Orchard Env's published figure: 1,000 sandboxes in 26 s ({1000 / 26:.1f}/s) on a real cluster")
    if memory:
        parts = ", ".join(f"{name} {size:.0f}" for name, size in memory.items())
        print(f"control plane memory after the run: {sum(memory.values()):.0f} MiB ({parts})")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=32, help="creating threads (each its own connection)")
    parser.add_argument("--skip-bare", action="store_true", help="only Orchard's path")
    args = parser.parse_args(argv)
    cluster: Any = None
    local = load_cluster_module()
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        cluster = local.kube_up(name=CLUSTER_NAME, nodes=max(4, args.sandboxes // 250 + 1))
        kubeconfig = str(cluster.kubeconfig)
    runs: list[Callable[[str, int, int], PathResult]] = [run_orchard] + ([] if args.skip_bare else [run_bare])
    try:
        results = [run(kubeconfig, args.sandboxes, args.threads) for run in runs]
        report(results, rss_mb(cluster.pids()) if cluster is not None else None)
    finally:
        if cluster is not None and cluster.started:  # leave the machine as it was
            local.kube_down(CLUSTER_NAME, purge=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
