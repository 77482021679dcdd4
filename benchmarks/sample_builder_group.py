"""The sample builder as several processes of one consumer group, timed over the same trajectories (the scale-out
measurement of ``consumer_pipeline.py --instances``).

Each instance is ``orchard consumer run sample-builder`` in a process of its own. Once every instance has joined and
holds its partitions they are paused (SIGSTOP) while the input is written, then resumed; the time is from the resume
to the group's committed offsets reaching the end of the input (the pause is shorter than a session, so no member
loses its partitions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from orchard.bus import Bus
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig


def bus_env(config: BusConfig) -> dict[str, str]:
    """The environment that points ``orchard consumer run`` at ``config``'s bus."""
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "ORCHARD_LOG_LEVEL": "INFO",
           "ORCHARD_CONSUMERS__RUNTIME__PROGRESS_INTERVAL_S": "3600"}  # fmt: skip
    if isinstance(config, EmbeddedBusConfig):
        return env | {"ORCHARD_BUS__TYPE": "embedded", "ORCHARD_BUS__PATH": str(config.path)}
    assert isinstance(config, KafkaBusConfig)
    return env | {"ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": config.bootstrap_servers,
                  "ORCHARD_BUS__MAX_RECORD_BYTES": str(config.max_record_bytes)}  # fmt: skip


def owned_partitions(log: Path) -> list[int]:
    """The partitions an instance's latest state restore covered (empty before its first)."""
    owned: list[int] = []
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"state restored"' in line:
            owned = sorted(json.loads(line)["partitions"])
    return owned


def scale_out(label: str, bus: Bus, config: BusConfig, trajectories: list[tuple[bytes, bytes | None]],
              count: int, partitions: int, work: Path) -> float:  # fmt: skip
    """Seconds ``count`` sample-builder processes of one group take over ``trajectories`` (see the module docstring)."""
    namespace = f"scale{count}-{uuid.uuid4().hex[:6]}"
    for topic in ("trajectories", "scores", "samples"):
        bus.create_topic(f"{namespace}.{topic}", partitions, exist_ok=True)
    logs = [work / f"{namespace}-{i}.log" for i in range(count)]
    command = [str(Path(sys.executable).parent / "orchard"), "consumer", "run", "sample-builder", "--namespace",
               namespace]  # fmt: skip
    processes = [subprocess.Popen([*command, "--instance", f"i{i}"], env=bus_env(config), stdout=subprocess.DEVNULL,
                                  stderr=log.open("w")) for i, log in enumerate(logs)]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while sorted(p for log in logs for p in owned_partitions(log)) != list(range(partitions)) or not all(
            owned_partitions(log) for log in logs
        ):
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                tails = [(p.poll(), log.read_text()[-1500:]) for p, log in zip(processes, logs, strict=True)]
                raise RuntimeError(f"{label}: {count} instances did not share the partitions: {tails}")
            time.sleep(0.05)
        for process in processes:  # the input is written while they are paused, so the time is theirs alone
            process.send_signal(signal.SIGSTOP)
        producer = bus.producer()
        for value, key in trajectories:
            producer.produce(f"{namespace}.trajectories", value, key)
        producer.flush(120)
        producer.close()
        started = time.perf_counter()
        for process in processes:
            process.send_signal(signal.SIGCONT)
        group, topic = f"{namespace}.sample-builder", f"{namespace}.trajectories"
        while sum(o for tp, o in bus.committed_offsets(group).items() if tp.topic == topic) < len(trajectories):
            if time.perf_counter() - started > 600 or any(p.poll() is not None for p in processes):
                tails = [(p.poll(), log.read_text()[-1500:]) for p, log in zip(processes, logs, strict=True)]
                raise RuntimeError(f"{label}: {count} instances did not finish: {tails}")
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(60)
