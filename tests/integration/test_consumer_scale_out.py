"""Scale-out: the sample builder and a group-level reward plug-in run as three instances of one consumer group, one
of them killed with SIGKILL mid-stream, and together they emit exactly what one instance emits from the same input.

Trajectories and scores are keyed by task (``orchard.episode_groups.stream_key``), so a rollout group and its scores
share a partition number, and both backends' groups hand partition ``p`` of every input topic to one member. The
killed member's partitions go to the survivors once its session lapses; they restore its state from the changelog
and finish its groups. Both backends; Kafka on the real broker.
"""

from __future__ import annotations

import json
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumers.builtin import build_processor
from consumers.config import ConsumersConfig, RewardsConfig, RuntimeConfig
from consumers.runtime import ConsumerRuntime, read_topic
from consumers.samples import SampleBuilderConfig
from consumers.synthetic import SyntheticEpisode, synthetic_episode
from orchard.bus import Bus
from orchard.config import BusConfig, KafkaBusConfig
from tests.integration.test_consumer_crash import ORCHARD, _assembled, _outputs, cli_env, emitted, events

PARTITIONS = 6  # two per instance
GROUP_PLUGIN = """
from consumers.rewards import RewardPlugin, Score


class GroupReward(RewardPlugin):
    name = "scale_centred"
    needs_groups = True

    def score_group(self, trajectories):
        mean = sum(t.reward for t in trajectories) / len(trajectories)
        return {t.episode_id: [Score(s.call_index, t.reward - mean + 0.01 * s.call_index) for s in t.steps]
                for t in trajectories}
"""
SETTINGS = {
    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE": "4",
    "ORCHARD_CONSUMERS__SAMPLE_BUILDER__SCORERS": json.dumps({"scale_centred": 0.5}),
    "ORCHARD_CONSUMERS__REWARDS__GROUP_SIZE": "4",
    "ORCHARD_CONSUMERS__RUNTIME__MAX_POLL_RECORDS": "1",  # one record per transaction: the kill lands mid-stream
}
# Kafka: a transaction the kill leaves open holds its partitions until the broker aborts it (this plus up to its 10 s
# check interval), and whoever takes them over waits that out before restoring: 10 s, not the default 30
KAFKA_SETTINGS = {"ORCHARD_BUS__TRANSACTION_TIMEOUT_S": "10"}


def _episodes() -> list[SyntheticEpisode]:
    """72 short episodes in 18 rollout groups of 4 (one task each), rewards mixed within every group."""
    return [
        synthetic_episode(f"s-{i}", calls=4, seed=i, first_prompt_tokens=120, completion_tokens=30,
                          group_id=f"g-{i // 4}", task_id=f"t-{i // 4}", reward=float(i % 3 == 0))
        for i in range(72)
    ]  # fmt: skip


def _run_in_process(bus: Bus, consumer: str, namespace: str, config: ConsumersConfig, kafka: bool) -> None:
    runtime = ConsumerRuntime(bus, build_processor(consumer, config), namespace=namespace, instance_id="one",
                              config=RuntimeConfig(poll_timeout_s=0.2))  # fmt: skip
    runtime.run(idle_exit_s=8.0 if kafka else 2.0)


def _instance(bus_config: BusConfig, consumer: str, namespace: str, name: str, log: Path, idle_exit: float,
              cwd: Path) -> subprocess.Popen:  # fmt: skip
    command = [str(ORCHARD), "consumer", "run", consumer, "--namespace", namespace, "--instance", name,
               "--idle-exit", str(idle_exit)]  # fmt: skip
    settings = SETTINGS | (KAFKA_SETTINGS if isinstance(bus_config, KafkaBusConfig) else {})
    return subprocess.Popen(command, env=cli_env(bus_config) | settings, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=log.open("w"))  # fmt: skip


def _owned(log: Path) -> list[list[int]]:
    """The partition numbers each state restore of an instance covered, in order."""
    return [sorted(e["partitions"]) for e in events(log, "state restored")]


def _dealt_out(latest: list[list[int]]) -> bool:
    """Whether every member owns partitions and together they own each one once."""
    return all(latest) and sorted(p for owned in latest for p in owned) == list(range(PARTITIONS))


@pytest.mark.slow
@pytest.mark.parametrize("consumer", ["sample-builder", "scale_out_plugin:GroupReward"])
def test_three_instances_with_one_killed_mid_stream_emit_exactly_what_one_instance_does(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path, consumer: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    kafka = isinstance(bus_config, KafkaBusConfig)
    (tmp_path / "scale_out_plugin.py").write_text(textwrap.dedent(GROUP_PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = ConsumersConfig(sample_builder=SampleBuilderConfig(group_size=4, scorers={"scale_centred": 0.5}),
                             rewards=RewardsConfig(group_size=4))  # fmt: skip
    output = "samples" if consumer == "sample-builder" else "scores"

    reference, scaled = unique_name("one"), unique_name("three")
    for topic in ("trajectories", "scores"):
        bus.create_topic(f"{reference}.{topic}", PARTITIONS)
        bus.create_topic(f"{scaled}.{topic}", PARTITIONS)
    _assembled(bus, kafka, reference, _episodes())
    inputs = ["trajectories"]
    if consumer == "sample-builder":  # its input: the trajectories and the group plug-in's scores of them
        _run_in_process(bus, "scale_out_plugin:GroupReward", reference, config, kafka)
        inputs.append("scores")
    _run_in_process(bus, consumer, reference, config, kafka)
    expected = _outputs(bus, f"{reference}.{output}")
    assert len(expected) >= 72, f"one instance emitted only {len(expected)} {output}"

    # three members join first; the input then arrives a slice at a time, so the kill lands while it streams
    idle_exit = 20.0 if kafka else 8.0  # survivors outwait the killed member's session (Kafka 10 s, here 2 s)
    logs = [tmp_path / f"instance-{i}.log" for i in range(3)]
    processes = [_instance(bus_config, consumer, scaled, f"i{i}", logs[i], idle_exit, tmp_path) for i in range(3)]
    deadline = time.monotonic() + 120
    while not _dealt_out([(_owned(log) or [[]])[-1] for log in logs]):
        assert all(p.poll() is None for p in processes), [log.read_text()[-2000:] for log in logs]
        assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
        time.sleep(0.1)
    records = [r for topic in inputs for r in read_topic(bus, f"{reference}.{topic}", poll_timeout_s=0.3)]
    producer = bus.producer()
    killed: list[int] = []
    for i, record in enumerate(records):
        producer.produce(f"{scaled}.{record.topic.removeprefix(reference + '.')}", record.value, record.key)
        if i % 8 == 7:
            producer.flush()
            time.sleep(0.1)
        if i == len(records) * 2 // 5:
            producer.flush()
            killed = _owned(logs[0])[-1]
            processes[0].send_signal(signal.SIGKILL)
            assert processes[0].wait(timeout=30) == -signal.SIGKILL, "the instance exited before the kill"
    producer.flush()
    producer.close()

    for process, log in zip(processes[1:], logs[1:], strict=True):
        assert process.wait(timeout=240) == 0, log.read_text()[-3000:]
    assert _outputs(bus, f"{scaled}.{output}") == expected
    assert events(logs[0], "consumer stopped") == [], "the killed instance stopped by itself"
    taken_over = [p for log in logs[1:] for owned in _owned(log) for p in owned if p in killed]
    assert killed and taken_over, f"no survivor took over the killed instance's partitions {killed}"
    assert all(events(log, "consumer stopped")[0]["records_in"] > 0 for log in logs[1:])
    assert emitted(bus, f"{scaled}.dead-letters") == 0
