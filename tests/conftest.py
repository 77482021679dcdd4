"""Shared pytest fixtures: the one place that starts real services (Apache Kafka, an S3 store, a Kubernetes
control plane) for tests.

Services come from ``infra/local/services.py`` and ``infra/local/kubernetes/cluster.py`` (loaded by path:
``infra/`` is not a package), or from the environment when ``ORCHARD_KAFKA_BOOTSTRAP`` / ``ORCHARD_S3_ENDPOINT`` /
``ORCHARD_K8S_TEST_KUBECONFIG`` are set. A service that cannot start fails the tests that need it; nothing is skipped.

The session services ("test-kafka", "test-s3", "test-kubernetes") are shared with other pytest processes in the
same checkout: each process holds a lease file while it uses one, and the last holder stops what a fixture started
(never a service someone started by hand).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import re
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICES_PATH = REPO_ROOT / "infra" / "local" / "services.py"
KUBERNETES_CLUSTER_PATH = REPO_ROOT / "infra" / "local" / "kubernetes" / "cluster.py"
TEST_KUBERNETES_NAME = "test-kubernetes"
TEST_KUBERNETES_PORT_BASE = 16540
TEST_KAFKA_NAME = "test-kafka"
TEST_S3_NAME = "test-s3"
TEST_KAFKA_PORT_BASE = 19192  # preferred; moved to the next free block when taken
TEST_S3_PORT_BASE = 18433
DEDICATED_KAFKA_PORT_BASE = 19292

T = TypeVar("T")
KafkaService = Any  # services.KafkaService: a class of a module loaded by path, opaque to type checkers
S3Service = Any  # services.S3Service


def load_by_path(name: str, path: Path) -> ModuleType:
    """Load the script at ``path`` once per process as module ``name`` (``infra/`` is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


def load_services() -> ModuleType:
    """Load ``infra/local/services.py`` once per process as module ``orchard_local_services``."""
    return load_by_path("orchard_local_services", SERVICES_PATH)


services = load_services()


def load_kubernetes_cluster() -> ModuleType:
    """Load ``infra/local/kubernetes/cluster.py`` once per process as ``orchard_local_kubernetes``."""
    return load_by_path("orchard_local_kubernetes", KUBERNETES_CLUSTER_PATH)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _shared_service(name: str, up: Callable[[], T], down: Callable[[], object]) -> Iterator[T]:
    """Use the service ``name`` under a lease; the last lease holder stops it if a fixture started it."""
    leases = services.service_dir(name) / "leases"
    lease = leases / str(os.getpid())
    with services.service_lock(name):
        service = up()
        leases.mkdir(exist_ok=True)
        if service.started:
            (leases / "fixture-started").touch()
        lease.touch()
    try:
        yield service
    finally:
        with services.service_lock(name):
            lease.unlink(missing_ok=True)
            holders = [p for p in leases.glob("[0-9]*") if _pid_alive(int(p.name))]
            if not holders and (leases / "fixture-started").exists():
                down()


@pytest.fixture(scope="session")
def local_services() -> ModuleType:
    """The ``infra/local/services.py`` module (kafka_up, kafka_down, s3_up, s3_down, ServiceError, ...)."""
    return services


@pytest.fixture(scope="session")
def managed_kafka() -> Iterator[KafkaService]:
    """The session's single-node broker "test-kafka", started by services.py (never an external one)."""

    def up() -> KafkaService:
        return services.kafka_up(name=TEST_KAFKA_NAME, fresh=True, default_port_base=TEST_KAFKA_PORT_BASE)

    with _shared_service(TEST_KAFKA_NAME, up, lambda: services.kafka_down(TEST_KAFKA_NAME, purge=True)) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of a real broker: ``$ORCHARD_KAFKA_BOOTSTRAP`` if set, else the session's "test-kafka"."""
    external = os.environ.get("ORCHARD_KAFKA_BOOTSTRAP")
    if external:
        return external
    bootstrap: str = request.getfixturevalue("managed_kafka").bootstrap
    return bootstrap


@pytest.fixture(scope="session")
def managed_s3() -> Iterator[S3Service]:
    """The session's SeaweedFS "test-s3", started by services.py (never an external endpoint)."""

    def up() -> S3Service:
        return services.s3_up(name=TEST_S3_NAME, fresh=True, default_port_base=TEST_S3_PORT_BASE)

    with _shared_service(TEST_S3_NAME, up, lambda: services.s3_down(TEST_S3_NAME, purge=True)) as s3:
        yield s3


@pytest.fixture(scope="session")
def s3_service(request: pytest.FixtureRequest) -> S3Service:
    """A real S3 endpoint: ``$ORCHARD_S3_ENDPOINT`` (+ ``_ACCESS_KEY``/``_SECRET_KEY``) if set, else "test-s3"."""
    endpoint = os.environ.get("ORCHARD_S3_ENDPOINT")
    if not endpoint:
        return request.getfixturevalue("managed_s3")
    return services.S3Service(
        name="external",
        endpoint=endpoint,
        access_key=os.environ.get("ORCHARD_S3_ACCESS_KEY", services.S3_ACCESS_KEY),
        secret_key=os.environ.get("ORCHARD_S3_SECRET_KEY", services.S3_SECRET_KEY),
    )


@dataclass(frozen=True)
class KubernetesTarget:
    """A cluster for the tests marked ``kubernetes``.

    Attributes:
        kubeconfig: its kubeconfig (admin rights on the local control plane).
        local: True for the local control plane, whose kwok nodes run execs on this host (``node_exec_root``).
        control_plane: the local cluster's handle (restart, requests), None for an external cluster.
    """

    kubeconfig: Path
    local: bool
    control_plane: Any = None


@pytest.fixture(scope="session")
def kubernetes_target() -> Iterator[KubernetesTarget]:
    """``$ORCHARD_K8S_TEST_KUBECONFIG``'s cluster when set (never a plain ``$KUBECONFIG``: the tests create and
    delete pods), else the session's local control plane "test-kubernetes" (etcd, kube-apiserver, scheduler,
    controller manager, kwok), shared like Kafka."""
    external = os.environ.get("ORCHARD_K8S_TEST_KUBECONFIG")
    if external:
        yield KubernetesTarget(Path(external), local=False)
        return
    cluster = load_kubernetes_cluster()

    def up() -> Any:
        return cluster.kube_up(name=TEST_KUBERNETES_NAME, fresh=True, default_port_base=TEST_KUBERNETES_PORT_BASE)

    with _shared_service(TEST_KUBERNETES_NAME, up, lambda: cluster.kube_down(TEST_KUBERNETES_NAME, purge=True)) as up_:
        yield KubernetesTarget(up_.kubeconfig, local=True, control_plane=up_)


class DedicatedKafka(Protocol):
    """Starts a private cluster for one test (stop/restart allowed); all are stopped and deleted after it."""

    def __call__(self, brokers: int = 1) -> KafkaService: ...


def _reap_orphaned_dedicated() -> None:
    """Stop and delete dedicated clusters left by pytest processes that died before their teardown."""
    root = services.services_root()
    for directory in root.glob("test-kafka-*-*") if root.exists() else ():
        owner = directory.name.split("-")[2]
        if owner.isdigit() and not _pid_alive(int(owner)):
            services.kafka_down(directory.name, purge=True)
            _remove_service_dir(directory.name)


def _remove_service_dir(name: str) -> None:
    with contextlib.suppress(OSError):
        services.service_dir(name).joinpath(".lock").unlink()
        services.service_dir(name).rmdir()


@pytest.fixture
def dedicated_kafka() -> Iterator[DedicatedKafka]:
    """A factory of private Kafka clusters (default one node) on free ports, torn down after the test."""
    _reap_orphaned_dedicated()
    started: list[str] = []

    def start(brokers: int = 1) -> KafkaService:
        name = f"test-kafka-{os.getpid()}-{len(started)}"
        started.append(name)
        # ports recorded by a service stay reserved while it is stopped, so a restart finds them free
        return services.kafka_up(name=name, brokers=brokers, fresh=True, default_port_base=DEDICATED_KAFKA_PORT_BASE)

    try:
        yield start
    finally:
        for name in started:
            services.kafka_down(name, purge=True)
            _remove_service_dir(name)


_NAME_UNSAFE = re.compile(r"[^a-z0-9]+")


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """``unique_name(prefix)``: a name unique to this test and call, valid as a Kafka topic or group and an
    S3 bucket (lowercase letters, digits and dashes, 3-63 characters, starting and ending alphanumeric)."""
    token = secrets.token_hex(3)
    counter = itertools.count()

    def make(prefix: str) -> str:
        clean = _NAME_UNSAFE.sub("-", prefix.lower()).strip("-")[:40] or "t"
        if clean.startswith(("xn-", "sthree")):  # reserved S3 bucket prefixes
            clean = f"t-{clean}"[:40]
        return f"{clean}-{token}-{next(counter)}"

    return make
