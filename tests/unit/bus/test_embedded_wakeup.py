"""A consumer of the embedded bus waiting for records wakes as soon as this process appends one; a write from
another process is still seen by its periodic look."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.bus import Bus, open_bus
from orchard.bus.embedded import consumer as embedded_consumer
from orchard.config import EmbeddedBusConfig

TOPIC = "t"


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[Bus]:
    with open_bus(EmbeddedBusConfig(path=tmp_path / "bus")) as bus:
        bus.create_topic(TOPIC, partitions=1)
        yield bus


def test_a_waiting_consumer_wakes_at_once_when_this_process_appends(bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded_consumer, "POLL_SLEEP_S", 5.0)  # without the wake-up it would look again in 5 s
    consumer = bus.consumer(group="g", topics=[TOPIC])
    consumer.poll(timeout_s=0.0)  # joined and assigned
    appended_at: list[float] = []

    def append_later() -> None:
        time.sleep(0.2)
        with bus.producer() as producer:
            producer.produce(TOPIC, b"v", partition=0)
            producer.flush()
        appended_at.append(time.monotonic())

    writer = threading.Thread(target=append_later)
    writer.start()
    records = consumer.poll(timeout_s=10.0)
    returned_at = time.monotonic()
    writer.join()
    consumer.close()

    assert [r.value for r in records] == [b"v"]
    assert returned_at - appended_at[0] < 1.0


def test_an_append_by_another_process_is_seen_by_the_periodic_look(bus: Bus, tmp_path: Path) -> None:
    consumer = bus.consumer(group="g", topics=[TOPIC])
    consumer.poll(timeout_s=0.0)
    script = (
        "from pathlib import Path; from orchard.bus import open_bus; from orchard.config import EmbeddedBusConfig\n"
        f"with open_bus(EmbeddedBusConfig(path=Path({str(tmp_path / 'bus')!r}))) as bus, bus.producer() as p:\n"
        f"    p.produce({TOPIC!r}, b'from afar', partition=0); p.flush()\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)

    records = consumer.poll(timeout_s=5.0)
    consumer.close()

    assert [r.value for r in records] == [b"from afar"]
