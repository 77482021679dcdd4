"""Ports of the local services: each kind's port layout from a base, which ports are free or recorded by another
service, and choosing a base (an explicit one must be free; else the stored or default one, moved up when taken)."""

from __future__ import annotations

import contextlib
import fcntl
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .processes import _note
from .state import ServiceError, _read_state, services_root

HOST = "127.0.0.1"
# Below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default): an outgoing connection never takes
# a port from these blocks, so a broker killed with kill -9 finds its port free again when it restarts.
DEFAULT_KAFKA_PORT_BASE = 19092
DEFAULT_S3_PORT_BASE = 18333  # gRPC ports are these plus S3_GRPC_OFFSET: 28333-28336
S3_GRPC_OFFSET = 10000
PORT_BLOCK = 10  # step between candidate port bases when the preferred one is taken


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
