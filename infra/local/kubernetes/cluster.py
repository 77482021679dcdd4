#!/usr/bin/env python3
"""A real Kubernetes control plane on loopback, without containers: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and kwok's simulated nodes.

The binaries come from ``build.sh`` beside this file (built once from the Go module proxy into a versioned cache).
``up`` generates a CA and certificates with ``openssl``, starts etcd, the API server (RBAC on, the ServiceAccount and
ResourceQuota admission plugins as in any cluster), the scheduler, the controller manager (garbage collection,
namespaces, ServiceAccounts and their tokens) and kwok, registers ``nodes`` kwok nodes, waits until they are Ready and
the ``default`` ServiceAccount exists, and writes an admin kubeconfig. kwok runs pods as far as the API is concerned
(Pending, Running, deleted) and answers exec through the API server by running the command on this host (a
``ClusterExec`` with ``workDir`` ``/``): there is no container, so the runtime's ``node_exec_root`` gives each sandbox
its own directory.

CLI::

    python infra/local/kubernetes/cluster.py up [--name NAME] [--nodes N] [--port-base N] [--fresh]
    python infra/local/kubernetes/cluster.py down [--name NAME] [--purge]

``up`` prints ``KUBECONFIG=<path>`` on stdout (progress on stderr) and is idempotent. State lives in
``$ORCHARD_SERVICES_DIR/<name>/`` like Kafka's and S3's (``infra/local/services.py``, whose process and port helpers
this file uses). Ports: etcd ``base`` (clients) and ``base + 1`` (peers), the API server ``base + 2``, kwok's kubelet
server ``base + 3``. The scheduler and the controller manager serve nothing (``--secure-port 0``).

The scheduler, the controller manager and kwok use the admin credentials; this is a test control plane. What a
least-privilege client may do is tested with ServiceAccount tokens, which the API server checks against RBAC as any
cluster does.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
DEFAULT_PORT_BASE = 16440  # below the ephemeral range, apart from Kafka's 19092 and S3's 18333 blocks
DEFAULT_NODES = 4
NODE_PODS = 500  # each simulated node's pod capacity: 1,000 sandboxes fit on the default nodes
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
SERVICE_CIDR = "10.96.0.0/16"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def _load_services() -> ModuleType:
    """``infra/local/services.py`` (process, port and state helpers), loaded by path once per process."""
    name = "orchard_local_services"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE.parent / "services.py")
    if spec is None or spec.loader is None:
        raise ImportError("cannot load infra/local/services.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


services = _load_services()
ServiceError = services.ServiceError


def binaries_dir(build: bool = True) -> Path:
    """The directory holding the five binaries; builds them first (minutes to an hour, once) when ``build``."""
    if build:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False)  # noqa: S603, S607 - fixed argv
        if done.returncode != 0:
            raise ServiceError(f"building the control plane failed ({BUILD_SCRIPT}, exit {done.returncode})")
    printed = subprocess.run(  # noqa: S603, S607 - fixed argv
        ["bash", str(BUILD_SCRIPT), "--print-dir"], check=True, capture_output=True, text=True
    )
    return Path(printed.stdout.strip())


def _ports(base: int) -> list[int]:
    return [base, base + 1, base + 2, base + 3]


# ---------------------------------------------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)  # noqa: S603, S607
    if done.returncode != 0:
        raise ServiceError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()[-500:]}")


def _issue(pki: Path, name: str, subject: str, ext: str) -> None:
    """A key and a certificate ``name`` signed by the CA, valid for a year, with the extensions ``ext``."""
    (pki / f"{name}.ext").write_text(ext)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-subj", subject,
             "-out", f"{name}.csr", cwd=pki)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "365", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=pki)  # fmt: skip


def make_pki(pki: Path) -> None:
    """CA, API server serving certificate, admin client certificate, kwok's serving certificate, ServiceAccount keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "365",
             "-subj", "/CN=orchard-local-ca", cwd=pki)  # fmt: skip
    server = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    client = "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    api_names = (
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1"
    )
    _issue(pki, "apiserver", "/CN=kube-apiserver", server + f"subjectAltName={api_names}\n")
    _issue(pki, "kwok", "/CN=kwok", server + "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    # The admin identity (system:masters) is also the API server's identity towards kwok's kubelet server.
    _issue(pki, "admin", "/O=system:masters/CN=orchard-admin", client)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def kubeconfig_text(server: str, pki: Path) -> str:
    """An admin kubeconfig (JSON is YAML) with the certificates inlined, so it can be copied anywhere."""

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "orchard-local", "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")}}
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
            }
        ],
        "contexts": [{"name": "orchard-local", "context": {"cluster": "orchard-local", "user": "admin"}}],
        "current-context": "orchard-local",
    }
    return json.dumps(config, indent=2)


# ---------------------------------------------------------------------------------------------------- kwok


UNPULLABLE_IMAGE = "orchard.invalid/unpullable:latest"
"""Pods of this image never start: kwok reports ``ErrImagePull`` for them, as a kubelet does for a missing image."""

IMAGE_PULL_ERROR_STAGE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: orchard-image-pull-error
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.podIP'
      operator: 'DoesNotExist'
    - key: '.spec.containers.[0].image'
      operator: 'In'
      values: ['{UNPULLABLE_IMAGE}']
  weight: 1  # kwok's pod-ready has none (0): of the two, this stage is always chosen for such pods
  next:
    statusTemplate: |
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        state:
          waiting:
            reason: ErrImagePull
            message: 'pull access denied for {UNPULLABLE_IMAGE}: repository does not exist'
      {{{{ end }}}}
      hostIP: {{{{ NodeIPWith .spec.nodeName | Quote }}}}
      podIP: 10.0.0.2
      phase: Pending
"""

KWOK_CONFIG = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  enableCNI: false
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterExec
metadata:
  name: local-exec
spec:
  execs:
  - local:
      workDir: /
"""


def kwok_config(binaries: Path) -> str:
    """kwok's configuration: local exec, kwok's own fast pod stages (from the build) and the image-pull-error stage.

    Naming any pod stage replaces kwok's built-in ones, so the fast stages the build copied from kwok's module are
    listed with it."""
    stages = sorted((binaries.parent / "kwok-stages").glob("pod-*.yaml"))
    if not stages:
        raise ServiceError(f"kwok's pod stages are missing beside {binaries}: run {BUILD_SCRIPT}")
    return "\n---\n".join([KWOK_CONFIG, *(path.read_text() for path in stages), IMAGE_PULL_ERROR_STAGE])


def node_object(name: str) -> dict[str, Any]:
    """A Node that kwok manages (it sets its conditions, addresses and kubelet endpoint)."""
    capacity = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti", "pods": str(NODE_PODS)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"},
        },
        "status": {"allocatable": capacity, "capacity": capacity},
    }


# ---------------------------------------------------------------------------------------------------- the cluster


@dataclass
class KubernetesCluster:
    """A local control plane managed by this script.

    Attributes:
        name: the service name (its state directory under ``services_root()``).
        port_base: etcd's client port; the others follow (module docstring).
        state_dir: certificates, data, logs, pid files, kubeconfig.
        nodes: how many kwok nodes it registers.
        started: whether the call that returned this object started a process.
    """

    name: str
    port_base: int
    state_dir: Path
    nodes: int = DEFAULT_NODES
    started: bool = False

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://{services.HOST}:{self.port_base + 2}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Path:
        """Certificates and keys."""
        return self.state_dir / "pki"

    def pid(self, component: str) -> int | None:
        """The live pid of one component, or None."""
        return services._read_pid(self._pid_file(component), self._marker(component))

    def pids(self) -> dict[str, int | None]:
        """Every component's live pid (None when stopped)."""
        return {component: self.pid(component) for component in COMPONENTS}

    def is_running(self) -> bool:
        """Whether every component runs and the API server is ready."""
        return all(pid is not None for pid in self.pids().values()) and self._get("/readyz") is not None

    def start(self, binaries: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start what is not running, in dependency order, and wait until the cluster can run pods."""
        deadline = time.monotonic() + timeout_s
        for component in COMPONENTS:
            if self.pid(component) is None:
                self.started = True
                services._spawn(self._command(component, binaries), self._log(component), self._pid_file(component),
                                self.state_dir)  # fmt: skip
            if component == "etcd":
                self._wait(component, lambda: services._tcp_open(self.port_base), deadline)
            elif component == "kube-apiserver":
                self._wait(component, lambda: self._get("/readyz") == "ok", deadline)
                self._register_nodes()
        self._wait("kwok", self._nodes_ready, deadline)
        self._wait("kube-controller-manager", self._default_service_account, deadline)

    def stop_component(self, component: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop one component (SIGTERM, then SIGKILL), e.g. the API server for a fault test."""
        services._terminate([(self._pid_file(component), self._marker(component))], timeout_s)

    def restart(self, component: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Stop one component, start it again and wait until the cluster is ready."""
        self.stop_component(component)
        self.start(binaries_dir(build=False), timeout_s=timeout_s)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every component (SIGTERM, then SIGKILL); data is kept."""
        for component in reversed(COMPONENTS):
            self.stop_component(component, timeout_s)

    # ---- requests

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        """One admin request to the API server: (HTTP status, body). Raises ``OSError`` when it does not answer."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)  # noqa: S310 - https to loopback
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=10) as reply:  # noqa: S310
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def _get(self, path: str) -> str | None:
        try:
            status, body = self.request("GET", path)
        except OSError:
            return None
        return body if status == 200 else None

    def _register_nodes(self) -> None:
        for index in range(self.nodes):
            status, body = self.request("POST", "/api/v1/nodes", node_object(f"kwok-node-{index}"))
            if status not in (201, 409):
                raise ServiceError(f"registering kwok-node-{index} failed: HTTP {status} {body[:300]}")

    def _nodes_ready(self) -> bool:
        listing = self._get("/api/v1/nodes?labelSelector=type%3Dkwok")
        if listing is None:
            return False
        ready = [
            node
            for node in json.loads(listing)["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))
            and not node.get("spec", {}).get("taints")
        ]
        return len(ready) >= self.nodes

    def _default_service_account(self) -> bool:
        return self._get("/api/v1/namespaces/default/serviceaccounts/default") is not None

    def _wait(self, component: str, done: Any, deadline: float) -> None:
        while not done():
            if self.pid(component) is None or time.monotonic() > deadline:
                why = "exited" if self.pid(component) is None else "was not ready in time"
                log = self._log(component)
                raise ServiceError(f"{component} of {self.name} {why}; log {log}:\n{services._log_tail(log)}")
            time.sleep(0.25)

    # ---- processes

    def _log(self, component: str) -> Path:
        return self.state_dir / f"{component}.log"

    def _pid_file(self, component: str) -> Path:
        return self.state_dir / f"{component}.pid"

    def _marker(self, component: str) -> str:
        """A string only this cluster's process of ``component`` has in its command line."""
        return f"{self.state_dir}/{component}"

    def _command(self, component: str, binaries: Path) -> list[str]:
        base, pki, host = self.port_base, self.pki, services.HOST
        own = self._marker(component)  # every command names its own state path: the pid guard's marker
        kubeconfig = f"--kubeconfig={self.kubeconfig}"
        if component == "etcd":
            peer = f"http://{host}:{base + 1}"
            return [str(binaries / "etcd"), f"--data-dir={own}", "--name=default",
                    f"--listen-client-urls=http://{host}:{base}", f"--advertise-client-urls=http://{host}:{base}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=default={peer}", "--unsafe-no-fsync=true", "--log-level=warn"]  # fmt: skip
        if component == "kube-apiserver":
            return [str(binaries / "kube-apiserver"), f"--cert-dir={own}",
                    f"--etcd-servers=http://{host}:{base}", f"--bind-address={host}", f"--advertise-address={host}",
                    f"--secure-port={base + 2}", f"--tls-cert-file={pki}/apiserver.crt",
                    f"--tls-private-key-file={pki}/apiserver.key", f"--client-ca-file={pki}/ca.crt",
                    f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=RBAC",
                    f"--kubelet-client-certificate={pki}/admin.crt", f"--kubelet-client-key={pki}/admin.key",
                    "--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true",
                    "--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
                    "--enable-priority-and-fairness=false", "--profiling=false", "--v=0"]  # fmt: skip
        if component == "kube-controller-manager":
            return [str(binaries / "kube-controller-manager"), kubeconfig, f"--cert-dir={own}",
                    "--leader-elect=false", "--secure-port=0", f"--service-account-private-key-file={pki}/sa.key",
                    f"--root-ca-file={pki}/ca.crt", f"--service-cluster-ip-range={SERVICE_CIDR}",
                    "--kube-api-qps=200", "--kube-api-burst=400", "--concurrent-gc-syncs=20", "--v=0"]  # fmt: skip
        if component == "kube-scheduler":
            return [str(binaries / "kube-scheduler"), kubeconfig, f"--cert-dir={own}", "--leader-elect=false",
                    "--secure-port=0", "--kube-api-qps=500", "--kube-api-burst=1000", "--v=0"]  # fmt: skip
        return [str(binaries / "kwok"), kubeconfig, f"--config={own}.yaml", "--manage-all-nodes=true",
                f"--node-ip={host}", f"--node-port={base + 3}", f"--server-address={host}:{base + 3}",
                f"--tls-cert-file={pki}/kwok.crt", f"--tls-private-key-file={pki}/kwok.key",
                "--node-lease-duration-seconds=40"]  # fmt: skip


def _cluster(name: str, state: dict[str, Any], started: bool = False) -> KubernetesCluster:
    return KubernetesCluster(
        name, int(state["port_base"]), services.service_dir(name), int(state.get("nodes", DEFAULT_NODES)), started
    )


def kube_up(
    name: str = "kubernetes",
    nodes: int = DEFAULT_NODES,
    port_base: int | None = None,
    fresh: bool = False,
    timeout_s: float = READY_TIMEOUT_S,
    default_port_base: int = DEFAULT_PORT_BASE,
) -> KubernetesCluster:
    """Start (or find running) the local control plane ``name``; idempotent. Builds the binaries on first use.

    ``fresh`` deletes the stored state (etcd data, certificates) of a stopped cluster first; a running cluster is
    returned as it is (another process may be using it). Raises ServiceError with a component's log tail when it
    exits or is not ready within ``timeout_s``.
    """
    binaries = binaries_dir(build=True)
    with services.service_lock(name) as directory:
        state = services._read_state(directory)
        if state is not None and state.get("kind") == "kubernetes":
            if _cluster(name, state).is_running():
                return _cluster(name, state)
            _stop_recorded(name, state)  # a partly running cluster holds its own ports: stop it before choosing
        with services._allocation_lock():
            stored = int(state["port_base"]) if state and state.get("kind") == "kubernetes" and not fresh else None
            base = services._choose_base(name, port_base, stored, default_port_base, _ports)
            if fresh or state is None or state.get("port_base") != base:
                services._wipe(directory)
            services._write_state(directory, {"kind": "kubernetes", "port_base": base, "nodes": nodes})
        cluster = _cluster(name, {"port_base": base, "nodes": nodes})
        if not (cluster.pki / "ca.crt").exists():
            make_pki(cluster.pki)
        cluster.kubeconfig.write_text(kubeconfig_text(cluster.server, cluster.pki))
        Path(f"{cluster._marker('kwok')}.yaml").write_text(kwok_config(binaries))
        try:
            cluster.start(binaries, timeout_s=timeout_s)
        except ServiceError:
            if cluster.started:
                cluster.stop(timeout_s=5.0)
            raise
        return cluster


def _stop_recorded(name: str, state: dict[str, Any] | None) -> None:
    if state is not None and state.get("kind") == "kubernetes":
        _cluster(name, state).stop(timeout_s=5.0)


def kube_down(name: str = "kubernetes", purge: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> bool:
    """Stop the control plane ``name`` (idempotent); ``purge`` also deletes its state. True if anything ran."""
    if not services.service_dir(name).exists():
        return False
    with services.service_lock(name) as directory:
        state = services._read_state(directory)
        was_running = False
        if state is not None and state.get("kind") == "kubernetes":
            cluster = _cluster(name, state)
            was_running = any(pid is not None for pid in cluster.pids().values())
            cluster.stop(timeout_s=timeout_s)
        if purge:
            services._wipe(directory)
    return was_running


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = argparse.ArgumentParser(description="A local Kubernetes control plane (kube-apiserver + kwok nodes).")
    actions = parser.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="build once, start (idempotent) and print KUBECONFIG=...")
    up.add_argument("--name", default="kubernetes")
    up.add_argument("--nodes", type=int, default=DEFAULT_NODES)
    up.add_argument("--port-base", type=int, default=None)
    up.add_argument("--fresh", action="store_true", help="delete the stored state of a stopped cluster first")
    down = actions.add_parser("down", help="stop (idempotent)")
    down.add_argument("--name", default="kubernetes")
    down.add_argument("--purge", action="store_true", help="also delete its state")
    actions.add_parser("build", help="only build the binaries")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            cluster = kube_up(args.name, args.nodes, args.port_base, args.fresh)
            print(f"KUBECONFIG={cluster.kubeconfig}")
        elif args.action == "down":
            stopped = kube_down(args.name, args.purge)
            services._note(f"kubernetes {args.name}: {'stopped' if stopped else 'not running'}")
        else:
            print(binaries_dir(build=True))
    except ServiceError as exc:
        services._note(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
