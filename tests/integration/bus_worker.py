"""A consume-transform-produce worker run as a separate process, so tests can ``kill -9`` it mid-batch.

Usage: bus_worker.py BUS_CONFIG_JSON INPUT OUTPUT GROUP MODE [DELAY_S]
MODE is ``transactional`` (records and offsets commit together) or ``plain`` (produce, flush, then commit).
Each input value ``v`` becomes output ``v + b"|out"``. The worker exits when the input stays empty for 4 s.
"""

from __future__ import annotations

import sys
import time

from pydantic import TypeAdapter

from orchard.bus import open_bus
from orchard.config import BusConfig


def main() -> None:
    """Run the worker until its input is drained."""
    config_json, source, sink, group, mode = sys.argv[1:6]
    delay = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    bus = open_bus(TypeAdapter(BusConfig).validate_json(config_json))
    transactional = mode == "transactional"
    producer = bus.transactional_producer(f"{group}-worker") if transactional else bus.producer()
    consumer = bus.consumer([source], group, instance_id=f"{group}-worker")
    idle_since = time.monotonic()
    try:
        while time.monotonic() - idle_since < 4.0:
            batch = consumer.poll(max_records=10, timeout_s=0.5)
            if not batch:
                continue
            idle_since = time.monotonic()
            if transactional:
                producer.begin()  # type: ignore[attr-defined]
            for record in batch:
                producer.produce(sink, record.value + b"|out", key=record.key)
                if not transactional:
                    producer.flush()  # output written before its offsets are committed: a kill leaves duplicates
                time.sleep(delay)  # widen the window in which a kill lands mid-batch
            if transactional:
                producer.commit(consumer)  # type: ignore[attr-defined]
            else:
                producer.flush()
                consumer.commit()
            print(f"committed {len(batch)}", flush=True)  # noqa: T201
    finally:
        consumer.close()
        producer.close()
        bus.close()


if __name__ == "__main__":
    main()
