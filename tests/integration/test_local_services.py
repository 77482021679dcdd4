"""The local services script (infra/local/services.py) against real processes: Apache Kafka and SeaweedFS S3."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from minio import Minio
from minio.error import S3Error

SERVICES_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "infra", "local", "services.py")


def _create_topic(bootstrap: str, topic: str, partitions: int = 1, replication: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, replication, config=config)])[topic].result(timeout=30)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def _consume(bootstrap: str, topic: str, group: str, count: int, timeout_s: float = 60.0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + timeout_s
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SERVICES_SCRIPT, *args], capture_output=True, text=True, timeout=180)


def _port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.kafka
def test_session_broker_round_trips_records(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("round-trip")
    _create_topic(kafka_bootstrap, topic)
    _produce(kafka_bootstrap, topic, [b"first", b"second"])
    assert _consume(kafka_bootstrap, topic, unique_name("group"), 2) == [b"first", b"second"]


@pytest.mark.kafka
def test_kafka_up_twice_returns_the_running_broker(local_services: ModuleType, managed_kafka: Any) -> None:
    pids = managed_kafka.pids()
    started = time.monotonic()
    again = local_services.kafka_up(name=managed_kafka.name)
    elapsed = time.monotonic() - started
    cli = _cli("kafka", "up", "--name", managed_kafka.name)
    assert (again.bootstrap, again.pids(), again.started) == (managed_kafka.bootstrap, pids, False)
    assert elapsed < 5.0
    assert (cli.returncode, cli.stdout) == (0, f"ORCHARD_KAFKA_BOOTSTRAP={managed_kafka.bootstrap}\n")
    assert managed_kafka.pids() == pids


@pytest.mark.kafka
@pytest.mark.slow
def test_broker_restarts_with_its_data_and_down_is_idempotent(
    dedicated_kafka: Any, local_services: ModuleType, unique_name: Callable[[str], str]
) -> None:
    kafka = dedicated_kafka()
    topic = unique_name("restart")
    _create_topic(kafka.bootstrap, topic)
    _produce(kafka.bootstrap, topic, [b"before"])
    kafka.stop()
    assert (kafka.pids(), _port_open(kafka.bootstrap)) == ({1: None}, False)
    kafka.start()
    _produce(kafka.bootstrap, topic, [b"after"])
    assert _consume(kafka.bootstrap, topic, unique_name("group"), 2) == [b"before", b"after"]

    assert local_services.kafka_down(kafka.name) is True
    assert (kafka.pids(), _port_open(kafka.bootstrap)) == ({1: None}, False)
    assert local_services.kafka_down(kafka.name) is False
    cli = _cli("kafka", "down", "--name", kafka.name)
    assert (cli.returncode, cli.stdout, cli.stderr) == (0, "", f"kafka {kafka.name}: not running\n")


@pytest.mark.kafka
@pytest.mark.slow
def test_three_broker_cluster_replicates_and_survives_one_node(
    dedicated_kafka: Any, local_services: ModuleType, unique_name: Callable[[str], str]
) -> None:
    kafka = dedicated_kafka(brokers=3)
    topic = unique_name("replicated")
    _create_topic(kafka.bootstrap, topic, partitions=3, replication=3, **{"min.insync.replicas": "2"})
    expected = {partition: ([1, 2, 3], [1, 2, 3]) for partition in range(3)}
    admin, replicas, deadline = AdminClient({"bootstrap.servers": kafka.bootstrap}), {}, time.monotonic() + 30
    while replicas != expected and time.monotonic() < deadline:  # metadata reaches every broker a moment later
        metadata = admin.list_topics(topic, timeout=10)
        replicas = {p.id: (sorted(p.replicas), sorted(p.isrs)) for p in metadata.topics[topic].partitions.values()}
        time.sleep(0.2)
    assert replicas == expected

    group = unique_name("group")
    _produce(kafka.bootstrap, topic, [b"a", b"b", b"c"])
    assert sorted(_consume(kafka.bootstrap, topic, group, 3)) == [b"a", b"b", b"c"]
    kafka.stop(node=3)
    _produce(kafka.bootstrap, topic, [b"d", b"e", b"f"])  # acks=all still met: min.insync.replicas is 2
    assert sorted(_consume(kafka.bootstrap, topic, group, 3)) == [b"d", b"e", b"f"]  # the group resumes

    assert local_services.kafka_down(kafka.name) is True
    assert kafka.pids() == {1: None, 2: None, 3: None}


@pytest.mark.s3
def test_s3_up_twice_returns_the_running_server(local_services: ModuleType, managed_s3: Any) -> None:
    pid = managed_s3.pid()
    started = time.monotonic()
    again = local_services.s3_up(name=managed_s3.name)
    elapsed = time.monotonic() - started
    cli = _cli("s3", "up", "--name", managed_s3.name)
    assert (again.endpoint, again.pid(), again.started) == (managed_s3.endpoint, pid, False)
    assert elapsed < 5.0
    assert (cli.returncode, cli.stdout) == (0, f"ORCHARD_S3_ENDPOINT={managed_s3.endpoint}\n")


@pytest.mark.s3
def test_s3_stores_objects_for_the_configured_identity(s3_service: Any, unique_name: Callable[[str], str]) -> None:
    client = Minio(s3_service.endpoint, s3_service.access_key, s3_service.secret_key, secure=False)
    bucket = unique_name("bucket")
    payload = os.urandom(3 * 1024 * 1024 + 17)
    client.make_bucket(bucket)
    client.put_object(bucket, "weights/step-1.bin", io.BytesIO(payload), len(payload))
    response = client.get_object(bucket, "weights/step-1.bin")
    try:
        assert response.read() == payload
    finally:
        response.close()
        response.release_conn()
    assert [o.object_name for o in client.list_objects(bucket, recursive=True)] == ["weights/step-1.bin"]


@pytest.mark.s3
@pytest.mark.parametrize(
    ("access_key", "secret_key", "code"),
    [(None, "wrong-secret", "SignatureDoesNotMatch"), ("nobody", "wrong-secret", "InvalidAccessKeyId")],
)
def test_s3_rejects_wrong_credentials(
    s3_service: Any, unique_name: Callable[[str], str], access_key: str | None, secret_key: str, code: str
) -> None:
    owner = Minio(s3_service.endpoint, s3_service.access_key, s3_service.secret_key, secure=False)
    bucket = unique_name("private")
    owner.make_bucket(bucket)
    owner.put_object(bucket, "secret.txt", io.BytesIO(b"top"), 3)
    intruder = Minio(s3_service.endpoint, access_key or s3_service.access_key, secret_key, secure=False)
    with pytest.raises(S3Error) as denied:
        intruder.get_object(bucket, "secret.txt")
    assert denied.value.code == code
