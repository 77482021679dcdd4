"""Faults on a real Apache Kafka broker: a restart mid-stream loses no acknowledged record and doubles none; a broker
that stops answering for longer than a request's time-out is waited for; a static member fenced by another consumer
stops, one that fenced itself rejoins where it was."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as RawTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from orchard.bus import BusError, BusUnavailableError, Delivery
from orchard.bus.base import poll_through_self_fence
from orchard.bus.exceptions import MemberFencedError
from orchard.bus.kafka import KafkaBus, KafkaConsumer
from orchard.config import KafkaBusConfig


@pytest.mark.kafka
@pytest.mark.slow
def test_broker_restart_mid_stream_loses_and_duplicates_nothing(dedicated_kafka: Callable[..., Any]) -> None:
    service = dedicated_kafka()
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=service.bootstrap))
    bus.create_topic("stream", partitions=2)
    producer = bus.producer()
    acknowledged: list[bytes] = []
    failed: list[str] = []

    def delivered_for(value: bytes) -> Callable[[Delivery], None]:
        def delivered(delivery: Delivery) -> None:
            (failed.append(delivery.error) if delivery.error else acknowledged.append(value))

        return delivered

    def restart() -> None:
        time.sleep(1.0)
        service.stop()
        time.sleep(1.0)
        service.start()

    restarter = threading.Thread(target=restart)
    restarter.start()
    total, i = 0, 0
    while restarter.is_alive() or i < 200:  # keep producing through the stop, the outage and the start
        value = f"record-{i:06d}".encode()
        producer.produce("stream", value, key=f"k{i % 17}".encode(), on_delivery=delivered_for(value))
        i += 1
        time.sleep(0.003)
    restarter.join()
    total = i
    producer.flush(timeout_s=120)

    consumer = bus.consumer(["stream"])
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline:
        seen.extend(r.value for r in consumer.poll(max_records=1000, timeout_s=1.0))
    seen.extend(r.value for r in consumer.poll(max_records=1000, timeout_s=1.0))
    consumer.close()
    bus.close()

    assert failed == []
    assert sorted(acknowledged) == [f"record-{n:06d}".encode() for n in range(total)]
    assert sorted(seen) == sorted(acknowledged)


@contextmanager
def paused(pid: int, after_s: float, for_s: float) -> Iterator[None]:
    """SIGSTOP ``pid`` ``after_s`` from now for ``for_s`` seconds (then SIGCONT), in the background."""

    def pause() -> None:
        time.sleep(after_s)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(for_s)
        finally:
            os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=pause)
    thread.start()
    try:
        yield
    finally:
        thread.join()
        os.kill(pid, signal.SIGCONT)


@pytest.mark.kafka
@pytest.mark.slow
def test_reads_and_topic_creation_wait_for_a_paused_broker_and_give_up_clearly(
    dedicated_kafka: Callable[..., Any],
) -> None:
    service = dedicated_kafka()
    pid = service.pid(1)
    patient = KafkaBus(KafkaBusConfig(bootstrap_servers=service.bootstrap, request_timeout_s=2, retry_timeout_s=60))
    impatient = KafkaBus(KafkaBusConfig(bootstrap_servers=service.bootstrap, request_timeout_s=2, retry_timeout_s=0))
    try:
        patient.create_topic("steady", partitions=2)
        producer = patient.producer()
        producer.send("steady", b"one")
        producer.close()
        impatient.watermarks(RawTopicPartition("steady", 0))  # its reader is connected before the pause

        # paused for three request time-outs: one attempt fails, the patient bus rides it out
        with paused(pid, after_s=0.5, for_s=6.0):
            time.sleep(1.0)
            started = time.monotonic()
            with pytest.raises(BusUnavailableError, match=r"cannot read offsets of steady\[0\]: still failing after"):
                impatient.watermarks(RawTopicPartition("steady", 0))
            info = patient.describe_topic("steady")
            patient.create_topic("created-while-paused", partitions=3, exist_ok=True)
            waited = time.monotonic() - started
        assert (info.partitions, info.record_count) == (2, 1)
        assert patient.describe_topic("created-while-paused").partitions == 3
        assert waited > 3.0  # it did wait out the pause, not return before it
    finally:
        patient.close()
        impatient.close()


@pytest.mark.kafka
def test_topics_on_one_broker_get_one_replica_and_min_isr_one(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    topic = unique_name("replicated")
    bus.create_topic(topic, partitions=2)
    bus.close()
    assert replication_of(kafka_bootstrap, topic) == ([1, 1], "1")


@pytest.mark.kafka
@pytest.mark.slow
def test_topics_on_three_brokers_get_three_replicas_and_min_isr_two(dedicated_kafka: Callable[..., Any]) -> None:
    service = dedicated_kafka(brokers=3)
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=service.bootstrap))
    bus.create_topic("durable", partitions=2)
    bus.create_topic("pinned", partitions=1, config={"min.insync.replicas": "3"})
    bus.close()
    assert replication_of(service.bootstrap, "durable") == ([3, 3], "2")
    assert replication_of(service.bootstrap, "pinned") == ([3], "3")  # a topic's own setting wins


def replication_of(bootstrap: str, topic: str) -> tuple[list[int], str]:
    """Replicas per partition and the topic's min.insync.replicas, as the broker reports them (asked again while
    the broker that answers has not heard of the new topic yet: on three brokers its metadata spreads in a moment)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        try:
            metadata = admin.list_topics(topic=topic, timeout=10).topics[topic]
            if metadata.error is not None:
                raise KafkaException(metadata.error)
            partitions = metadata.partitions
            resource = ConfigResource(ResourceType.TOPIC, topic)
            config = admin.describe_configs([resource])[resource].result(timeout=10)
            return [len(partitions[p].replicas) for p in sorted(partitions)], config["min.insync.replicas"].value
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.kafka
def test_a_fenced_static_member_raises_instead_of_polling_nothing(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    topic, group = unique_name("fenced"), unique_name("trainer")
    bus.create_topic(topic, partitions=2)
    bus.producer().send(topic, b"sample")
    first = bus.consumer([topic], group, instance_id="same-instance")
    second = None
    try:
        deadline = time.monotonic() + 30
        while not first.poll(timeout_s=1.0) and time.monotonic() < deadline:
            pass
        second = bus.consumer([topic], group, instance_id="same-instance")
        second.poll(timeout_s=1.0)
        with pytest.raises(MemberFencedError, match="was fenced: another consumer joined the group with the same") as e:
            while time.monotonic() < deadline + 30:
                poll_through_self_fence(first, timeout_s=1.0)  # another consumer's fence is not ridden out
        assert e.value.by_another is True
    finally:
        first.close()
        if second is not None:
            second.close()
        bus.close()


@pytest.mark.kafka
def test_a_static_member_that_rejoins_holds_its_instance_id_and_reads_on_from_its_poll_position(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """What a trainer does after fencing itself: nothing was committed, yet the fresh membership neither re-reads
    what was polled nor skips anything."""
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    topic, group = unique_name("rejoin"), unique_name("trainer")
    bus.create_topic(topic, partitions=2)
    producer = bus.producer()
    for i in range(40):
        producer.send(topic, f"{i}".encode(), key=f"k{i}".encode())
    producer.flush()
    consumer = bus.consumer([topic], group, instance_id="rejoiner")
    assert isinstance(consumer, KafkaConsumer)
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 15 and time.monotonic() < deadline:
            seen.extend(r.value for r in consumer.poll(max_records=5, timeout_s=1.0))
        consumer.rejoin()
        while len(seen) < 40 and time.monotonic() < deadline:
            seen.extend(r.value for r in consumer.poll(max_records=5, timeout_s=1.0))
        seen.extend(r.value for r in consumer.poll(timeout_s=2.0))
        assert sorted(seen, key=int) == [f"{i}".encode() for i in range(40)]  # each once
    finally:
        consumer.close()
        bus.close()


@pytest.mark.kafka
def test_only_a_group_consumer_can_rejoin(kafka_bootstrap: str, unique_name: Callable[[str], str]) -> None:
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    topic = unique_name("reader")
    bus.create_topic(topic, partitions=1)
    reader = bus.consumer([topic], group=None)
    try:
        with pytest.raises(BusError, match="only a group consumer can rejoin"):
            reader.rejoin()
    finally:
        reader.close()
        bus.close()
