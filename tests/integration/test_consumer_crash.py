"""Crash safety: the assembler run by the real CLI is killed with SIGKILL mid-stream, twice, then restarted.

Every episode's trajectory must appear exactly once (nothing lost, nothing doubled), and the restarted process must
have restored the state of the episodes that were open when its predecessor died (their earlier calls are behind
the committed offsets, so only the restored state can complete them). Both backends; Kafka on the real broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from consumers.runtime import read_topic
from consumers.synthetic import CapturedRecord, SyntheticEpisode, synthetic_episode
from orchard.bus import Bus
from orchard.codec import Codec
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig

CODEC = Codec.default()
REPO = Path(__file__).resolve().parents[2]
ORCHARD = Path(sys.executable).parent / "orchard"


def interleaved(episodes: list[SyntheticEpisode], window: int = 10, seed: int = 0) -> list[CapturedRecord]:
    rng = np.random.default_rng(seed)
    out: list[CapturedRecord] = []
    for start in range(0, len(episodes), window):
        wave = [r for e in episodes[start : start + window] for r in e.records]
        out += [wave[i] for i in rng.permutation(len(wave))]
    return out


def cli_env(bus_config: BusConfig) -> dict[str, str]:
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "ORCHARD_CONSUMERS__RUNTIME__MAX_POLL_RECORDS": "7"}
    if isinstance(bus_config, EmbeddedBusConfig):
        env |= {"ORCHARD_BUS__TYPE": "embedded", "ORCHARD_BUS__PATH": str(bus_config.path),
                "ORCHARD_BUS__SESSION_TIMEOUT_MS": str(bus_config.session_timeout_ms)}  # fmt: skip
    else:
        env |= {"ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": bus_config.bootstrap_servers}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def emitted(bus: Bus, topic: str) -> int:
    return bus.describe_topic(topic).record_count if topic in bus.list_topics() else 0


def start(bus_config: BusConfig, namespace: str, log: Path, idle_exit: float | None = None) -> subprocess.Popen:
    command = [str(ORCHARD), "consumer", "run", "assembler", "--namespace", namespace, "--instance", "crash-test"]
    if idle_exit is not None:
        command += ["--idle-exit", str(idle_exit)]
    return subprocess.Popen(command, env=cli_env(bus_config), stdout=subprocess.DEVNULL, stderr=log.open("w"))


def events(log: Path, name: str) -> list[dict]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == name]


def test_killed_mid_stream_the_assembler_loses_and_doubles_nothing(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    namespace = unique_name("crash")
    episodes = [synthetic_episode(f"c-{i}", calls=30, seed=i, first_prompt_tokens=300) for i in range(100)]
    for topic in ("model-calls", "outcomes"):
        bus.create_topic(f"{namespace}.{topic}", 4)
    producer = bus.producer()
    for record in interleaved(episodes):
        producer.produce(f"{namespace}.{record.topic}", record.value, record.key)
    producer.flush()
    producer.close()
    trajectories = f"{namespace}.trajectories"
    kafka = isinstance(bus_config, KafkaBusConfig)

    for attempt, fraction in enumerate((0.2, 0.5)):
        process = start(bus_config, namespace, tmp_path / f"run-{attempt}.log")
        deadline = time.monotonic() + 120
        while emitted(bus, trajectories) < fraction * len(episodes) and process.poll() is None:
            assert time.monotonic() < deadline, "the assembler made no progress"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL, "the assembler finished before it could be killed"

    final = tmp_path / "final.log"
    process = start(bus_config, namespace, final, idle_exit=8.0 if kafka else 3.0)
    assert process.wait(timeout=240) == 0, final.read_text()[-3000:]

    records = [CODEC.decode(r.value).record for r in read_topic(bus, trajectories, poll_timeout_s=0.3, idle_polls=4)]
    assert sorted(r["episode_id"] for r in records) == sorted(e.episode_id for e in episodes)  # once each
    by_episode = {r["episode_id"]: r for r in records}
    for episode in episodes:
        record = by_episode[episode.episode_id]
        assert (record["complete"], record["calls"], record["outcome"]) == (
            True, [c.value for c in episode.calls], episode.outcome.value,
        )  # fmt: skip
    assert max(e["keys"] for e in events(final, "state restored")) > 0, "the restarted assembler restored no state"
    assert events(final, "consumer stopped")[0]["records_in"] > 0, "the kills came after all input was processed"
    assert emitted(bus, f"{namespace}.dead-letters") == 0
