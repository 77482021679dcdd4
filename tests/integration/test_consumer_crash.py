"""Crash safety: each consumer run by the real CLI is killed with SIGKILL mid-stream, twice, then restarted.

The assembler: every episode's trajectory must appear exactly once (nothing lost, nothing doubled), and the
restarted process must have restored the state of the episodes that were open when its predecessor died (their
earlier calls are behind the committed offsets, so only the restored state can complete them). The sample builder
and a reward plug-in: what the killed-and-restarted consumer emitted equals, record for record, what an
uninterrupted run emits from the same input. Both backends; Kafka on the real broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumers.assembler import TrajectoryAssembler
from consumers.builtin import build_processor
from consumers.config import ConsumersConfig, RuntimeConfig
from consumers.runtime import ConsumerRuntime, RuntimeStats, read_topic
from consumers.samples import SampleBuilderConfig
from consumers.synthetic import SyntheticEpisode, interleaved, synthetic_episode
from orchard.bus import Bus
from orchard.bus.kafka import KafkaBus
from orchard.codec import Codec
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig

CODEC = Codec.default()
REPO = Path(__file__).resolve().parents[2]
ORCHARD = Path(sys.executable).parent / "orchard"


def cli_env(bus_config: BusConfig) -> dict[str, str]:
    # small batches, one poll per transaction: many commits to be killed between
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "ORCHARD_CONSUMERS__RUNTIME__MAX_POLL_RECORDS": "7",
           "ORCHARD_CONSUMERS__RUNTIME__TRANSACTION_INTERVAL_S": "0"}  # fmt: skip
    if isinstance(bus_config, EmbeddedBusConfig):
        env |= {"ORCHARD_BUS__TYPE": "embedded", "ORCHARD_BUS__PATH": str(bus_config.path),
                "ORCHARD_BUS__SESSION_TIMEOUT_MS": str(bus_config.session_timeout_ms)}  # fmt: skip
    else:
        env |= {"ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": bus_config.bootstrap_servers}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def emitted(bus: Bus, topic: str) -> int:
    return bus.describe_topic(topic).record_count if topic in bus.list_topics() else 0


def start(
    bus_config: BusConfig,
    namespace: str,
    log: Path,
    idle_exit: float | None = None,
    consumer: str = "assembler",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    command = [str(ORCHARD), "consumer", "run", consumer, "--namespace", namespace, "--instance", "crash-test"]
    if idle_exit is not None:
        command += ["--idle-exit", str(idle_exit)]
    return subprocess.Popen(command, env=cli_env(bus_config) | (env or {}), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))  # fmt: skip


def events(log: Path, name: str) -> list[dict]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [e for e in lines if e.get("event") == name]


# transactions of 50 polls each (the interval never ends them first): a kill lands inside one most of the time
MULTI_POLL = {"ORCHARD_CONSUMERS__RUNTIME__TRANSACTION_INTERVAL_S": "10",
              "ORCHARD_CONSUMERS__RUNTIME__TRANSACTION_MAX_RECORDS": "350"}  # fmt: skip


@pytest.mark.parametrize("transactions", [{}, MULTI_POLL], ids=["poll-per-transaction", "polls-per-transaction"])
def test_killed_mid_stream_the_assembler_loses_and_doubles_nothing(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path, transactions: dict[str, str]
) -> None:
    namespace = unique_name("crash")
    episodes = [synthetic_episode(f"c-{i}", calls=30, seed=i, first_prompt_tokens=300) for i in range(100)]
    _published(bus, namespace, episodes)
    trajectories = f"{namespace}.trajectories"
    kafka = isinstance(bus_config, KafkaBusConfig)

    for attempt, fraction in enumerate((0.2, 0.5)):
        process = start(bus_config, namespace, tmp_path / f"run-{attempt}.log", env=transactions)
        deadline = time.monotonic() + 120
        while emitted(bus, trajectories) < fraction * len(episodes) and process.poll() is None:
            assert time.monotonic() < deadline, "the assembler made no progress"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL, "the assembler finished before it could be killed"

    final = tmp_path / "final.log"
    process = start(bus_config, namespace, final, idle_exit=8.0 if kafka else 3.0, env=transactions)
    assert process.wait(timeout=240) == 0, final.read_text()[-3000:]

    records = [CODEC.decode(r.value).record for r in read_topic(bus, trajectories, poll_timeout_s=0.3)]
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


PLUGIN_MODULE = """
from consumers.rewards import RewardPlugin


class Reward(RewardPlugin):
    name = "crash_test_tokens"

    def score_step(self, step, trajectory):
        return float(len(step.completion_token_ids) + step.call_index)
"""
# One record per transaction: the downstream consumers are quick, and the kills must land while input remains.
SAMPLE_BUILDER_ENV = {
    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE": "4",
    "ORCHARD_CONSUMERS__RUNTIME__MAX_POLL_RECORDS": "1",
}


def _episodes() -> list[SyntheticEpisode]:
    """48 short episodes in groups of 4 with mixed rewards (recorded once: their timestamps are part of the data)."""
    return [
        synthetic_episode(f"d-{i}", calls=6, seed=i, first_prompt_tokens=200, completion_tokens=40,
                          group_id=f"g-{i // 4}", task_id=f"t-{i // 4}", reward=float(i % 2))
        for i in range(48)
    ]  # fmt: skip


def _published(bus: Bus, namespace: str, episodes: list[SyntheticEpisode]) -> None:
    """Publish ``episodes``' model calls and outcomes to ``<namespace>.*`` (4 partitions each), interleaved."""
    for topic in ("model-calls", "outcomes"):
        bus.create_topic(f"{namespace}.{topic}", 4)
    producer = bus.producer()
    for record in interleaved(episodes, window=10):
        producer.produce(f"{namespace}.{record.topic}", record.value, record.key)
    producer.flush()
    producer.close()


def _assembled(bus: Bus, kafka: bool, namespace: str, episodes: list[SyntheticEpisode]) -> None:
    """Publish ``episodes`` and assemble them into ``<namespace>.trajectories``."""
    _published(bus, namespace, episodes)
    runtime = ConsumerRuntime(bus, TrajectoryAssembler(), namespace=namespace, instance_id="setup",
                              config=RuntimeConfig(poll_timeout_s=0.2))  # fmt: skip
    runtime.run(idle_exit_s=8.0 if kafka else 2.0)


def _outputs(bus: Bus, topic: str) -> list[tuple[bytes | None, str]]:
    """Key and decoded record of each output, less its time field: that is the event time of the input records,
    which were published separately to the two namespaces."""
    records = []
    for record in read_topic(bus, topic, poll_timeout_s=0.3):
        fields = {k: v for k, v in CODEC.decode(record.value).record.items() if k not in ("created_at", "timestamp")}
        records.append((record.key, repr(sorted(fields.items()))))
    return sorted(records)


@pytest.mark.parametrize("consumer", ["sample-builder", "plugin:Reward"])
def test_killed_mid_stream_a_downstream_consumer_emits_exactly_what_an_uninterrupted_run_does(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path, consumer: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    kafka = isinstance(bus_config, KafkaBusConfig)
    (tmp_path / "plugin.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    output = "samples" if consumer == "sample-builder" else "scores"
    config = ConsumersConfig(sample_builder=SampleBuilderConfig(group_size=4))

    reference, crashed = unique_name("ref"), unique_name("crash")
    episodes = _episodes()
    for namespace in (reference, crashed):
        _assembled(bus, kafka, namespace, episodes)
    runtime = ConsumerRuntime(bus, build_processor(consumer, config), namespace=reference, instance_id="reference",
                              config=RuntimeConfig(poll_timeout_s=0.2))  # fmt: skip
    runtime.run(idle_exit_s=8.0 if kafka else 2.0)
    expected = _outputs(bus, f"{reference}.{output}")
    assert len(expected) >= 20, f"the reference run emitted only {len(expected)} {output}"

    for attempt, fraction in enumerate((0.1, 0.3)):
        process = start(bus_config, crashed, tmp_path / f"run-{attempt}.log", consumer=consumer,
                        env=SAMPLE_BUILDER_ENV, cwd=tmp_path)  # fmt: skip
        deadline = time.monotonic() + 120
        while emitted(bus, f"{crashed}.{output}") < fraction * len(expected) and process.poll() is None:
            assert time.monotonic() < deadline, (tmp_path / f"run-{attempt}.log").read_text()[-3000:]
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL, "the consumer finished before it could be killed"

    final = tmp_path / "final.log"
    process = start(bus_config, crashed, final, idle_exit=8.0 if kafka else 3.0, consumer=consumer,
                    env=SAMPLE_BUILDER_ENV, cwd=tmp_path)  # fmt: skip
    assert process.wait(timeout=240) == 0, final.read_text()[-3000:]
    assert _outputs(bus, f"{crashed}.{output}") == expected
    assert events(final, "consumer stopped")[0]["records_in"] > 0, "the kills came after all input was processed"


# A group member that dies inside a transaction holding the group's offset of one partition: it joins, reads one
# record, sends its offset in a transaction, leaves the group and kills itself before committing.
DEAD_IN_TRANSACTION = """
import os, signal, sys
from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, topic, group, timeout_ms = sys.argv[1:5]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
consumer.subscribe([topic])
message = None
while message is None or message.error():
    message = consumer.poll(1.0)
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group + ".dead",
                     "transaction.timeout.ms": int(timeout_ms)})
producer.init_transactions(30)
producer.begin_transaction()
producer.send_offsets_to_transaction([TopicPartition(topic, message.partition(), message.offset() + 1)],
                                     consumer.consumer_group_metadata(), 30)
consumer.close()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.kafka
@pytest.mark.slow
def test_a_member_killed_inside_a_transaction_is_outwaited_not_taken_for_idle(
    kafka_bootstrap: str, unique_name: Callable[[str], str]
) -> None:
    """Its partition's offset stays held (the next owner cannot fetch it) until the broker aborts the transaction;
    a member that took that for idleness would exit with the partition unread."""
    bus = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    try:
        _outwaits_a_held_offset(bus, kafka_bootstrap, unique_name("held"))
    finally:
        bus.close()


def _outwaits_a_held_offset(bus: KafkaBus, kafka_bootstrap: str, namespace: str) -> None:
    episodes = [synthetic_episode(f"h-{i}", calls=3, seed=i, first_prompt_tokens=50) for i in range(24)]
    _published(bus, namespace, episodes)
    runtime = ConsumerRuntime(bus, TrajectoryAssembler(), namespace=namespace, instance_id="next",
                              config=RuntimeConfig(poll_timeout_s=0.2))  # fmt: skip
    dead = subprocess.run([sys.executable, "-c", DEAD_IN_TRANSACTION, kafka_bootstrap,
                           f"{namespace}.model-calls", runtime.group, "8000"], timeout=90)  # fmt: skip
    assert dead.returncode == -signal.SIGKILL

    started = time.monotonic()
    stats = runtime.run(idle_exit_s=3.0)
    records = [CODEC.decode(r.value).record for r in read_topic(bus, f"{namespace}.trajectories", poll_timeout_s=0.3)]
    assert sorted(r["episode_id"] for r in records) == sorted(e.episode_id for e in episodes)
    assert all(r["complete"] for r in records)
    assert stats.records_in == sum(len(e.calls) + 1 for e in episodes)
    assert time.monotonic() - started >= 8.0 - 1, "the held offset was readable at once: nothing was tested"


class _CommitGate:
    """Stands in for a raw transactional producer; its ``pause_at``-th commit waits for ``release`` (offsets
    already sent into the transaction), the way a member paused by the OS or a long GC holds its last transaction
    while the group hands its partitions on."""

    def __init__(self, raw: object, pause_at: int, paused: threading.Event, release: threading.Event) -> None:
        self._raw, self._pause_at, self._paused, self._release = raw, pause_at, paused, release
        self.commits = 0

    def commit_transaction(self, *args: object) -> None:
        self.commits += 1
        if self.commits == self._pause_at:
            self._paused.set()
            self._release.wait(120)
        self._raw.commit_transaction(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._raw, name)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_partition_handed_over_mid_transaction_restores_what_its_old_owner_then_committed(
    kafka_bootstrap: str, unique_name: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Member A sends its offsets into a transaction and stalls before committing; the group gives its partitions
    to member B (A missed its poll deadline); A then commits. B must restore A's last state changes and read on
    from A's last offsets: restoring at once, to the changelog's readable end, would miss the changes while the
    offsets B reads on from include them (trajectories lost or emitted twice)."""
    namespace = unique_name("handover")
    # A: a dynamic member with a short poll deadline, so a stalled A leaves the group within seconds
    bus_a = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap, client_options={
        "max.poll.interval.ms": "7000", "session.timeout.ms": "6000"}))  # fmt: skip
    bus_b = KafkaBus(KafkaBusConfig(bootstrap_servers=kafka_bootstrap))
    paused, release = threading.Event(), threading.Event()
    gates: list[_CommitGate] = []
    make_producer, make_consumer = bus_a.transactional_producer, bus_a.consumer

    def gated_producer(transactional_id: str) -> object:
        producer = make_producer(transactional_id)
        gates.append(_CommitGate(producer.raw, 4, paused, release))
        producer.raw = gates[-1]  # type: ignore[assignment]
        return producer

    monkeypatch.setattr(bus_a, "transactional_producer", gated_producer)
    monkeypatch.setattr(bus_a, "consumer", lambda *a, **k: make_consumer(*a, **(k | {"instance_id": None})))
    try:
        episodes = [synthetic_episode(f"m-{i}", calls=3, seed=i, first_prompt_tokens=50) for i in range(24)]
        _published(bus_a, namespace, episodes)
        small = RuntimeConfig(poll_timeout_s=0.2, max_poll_records=5, transaction_interval_s=0)  # commits mid-stream
        a = ConsumerRuntime(bus_a, TrajectoryAssembler(), namespace=namespace, instance_id="a", config=small)
        b = ConsumerRuntime(bus_b, TrajectoryAssembler(), namespace=namespace, instance_id="b", config=small)
        a_thread = threading.Thread(target=a.run, daemon=True)
        a_thread.start()
        assert paused.wait(60), "A never reached its fourth commit"
        b_stats: list[RuntimeStats] = []
        b_thread = threading.Thread(target=lambda: b_stats.append(b.run(idle_exit_s=10.0)), daemon=True)
        b_thread.start()
        time.sleep(15)  # A misses its 7 s poll deadline and leaves; the group gives B every partition
        a.stop()
        release.set()
        a_thread.join(60)
        assert not a_thread.is_alive()
        assert a.stats.transactions == 4 and a.stats.aborted_batches == 0, "A's late commit did not go through"
        b_thread.join(180)
        assert b_stats, "B did not stop"
        records = [CODEC.decode(r.value).record
                   for r in read_topic(bus_b, f"{namespace}.trajectories", poll_timeout_s=0.3)]  # fmt: skip
        assert sorted(r["episode_id"] for r in records) == sorted(e.episode_id for e in episodes)
        assert all(r["complete"] for r in records)
        assert a.stats.records_in + b_stats[0].records_in == sum(len(e.calls) + 1 for e in episodes)
    finally:
        release.set()
        bus_a.close()
        bus_b.close()
