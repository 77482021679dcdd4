"""Local Apache Kafka: the broker jars fetched once with Maven, one or three combined KRaft broker+controller nodes
on the machine's Java (``KafkaService``), and ``kafka_up`` / ``kafka_down``."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ports import DEFAULT_KAFKA_PORT_BASE, HOST, _allocation_lock, _choose_base, _kafka_ports, _tcp_open
from .processes import LOG_TAIL_LINES, _log_tail, _note, _read_pid, _spawn, _terminate, _wait
from .state import ServiceError, _down, _read_state, _wipe, _write_state, service_dir, service_lock

KAFKA_VERSION = "4.1.1"
KAFKA_POM = Path(__file__).resolve().parents[1] / "kafka" / "pom.xml"
KAFKA_READY_TIMEOUT_S = 120.0
KAFKA_STOP_TIMEOUT_S = 30.0


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

    def stop(state: dict[str, Any]) -> bool:
        service = _kafka_service(name, state)
        was_running = any(pid is not None for pid in service.pids().values())
        service.stop(timeout_s=timeout_s)
        return was_running

    return _down(name, "kafka", purge, stop)
