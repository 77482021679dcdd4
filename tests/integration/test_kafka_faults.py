"""Faults on a real Apache Kafka broker: a restart mid-stream loses no acknowledged record and doubles none."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from orchard.bus import Delivery
from orchard.bus.kafka import KafkaBus
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
