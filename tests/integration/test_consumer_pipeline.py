"""Consumers on a real bus (both backends): the assembler through the runtime, dead letters, timeouts, a plug-in
reward through the real ``orchard consumer run`` CLI, and topic replay (determinism, namespace isolation)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumers.assembler import TrajectoryAssembler
from consumers.config import AssemblerConfig, RuntimeConfig
from consumers.replay import ReplayError, replay
from consumers.runtime import ConsumerRuntime, read_topic
from consumers.start import STAGE_STARTED_ENV
from consumers.synthetic import CapturedRecord, interleaved, synthetic_episode
from orchard.bus import Bus, Record
from orchard.codec import Codec
from orchard.config import BusConfig, EmbeddedBusConfig, KafkaBusConfig
from orchard.trajectory_records import trajectory_from_record, trajectory_record

CODEC = Codec.default()
REPO = Path(__file__).resolve().parents[2]
ORCHARD = Path(sys.executable).parent / "orchard"  # the installed console script: the real CLI
PLUGIN_MODULE = '''
from consumers.rewards import RewardPlugin


class Reward(RewardPlugin):
    """Scores each call by how many tokens it sampled (a made-up test reward)."""

    name = "token_count"

    def score_step(self, step, trajectory):
        return float(len(step.completion_token_ids))
'''


def publish(bus: Bus, namespace: str, records: list[CapturedRecord], extra: list[tuple[str, bytes]] = ()) -> None:
    for topic in ("model-calls", "outcomes"):
        bus.create_topic(f"{namespace}.{topic}", 4, exist_ok=True)
    producer = bus.producer()
    for record in records:
        producer.produce(f"{namespace}.{record.topic}", record.value, record.key)
    for topic, value in extra:
        producer.produce(f"{namespace}.{topic}", value, b"poison")
    producer.flush()
    producer.close()


def decoded(bus: Bus, topic: str) -> list[dict]:
    return [CODEC.decode(r.value).record for r in read_topic(bus, topic, poll_timeout_s=0.3)]


def idle_exit(bus_config: BusConfig) -> float:
    return 8.0 if isinstance(bus_config, KafkaBusConfig) else 2.0  # a Kafka group takes seconds to form


def run_assembler(bus: Bus, bus_config: BusConfig, namespace: str, config: AssemblerConfig | None = None) -> None:
    runtime = ConsumerRuntime(
        bus, TrajectoryAssembler(config), namespace=namespace, instance_id="test",
        config=RuntimeConfig(max_poll_records=40, poll_timeout_s=0.2),
    )  # fmt: skip
    runtime.run(idle_exit_s=idle_exit(bus_config))


def cli_env(bus_config: BusConfig) -> dict[str, str]:
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json"}
    if isinstance(bus_config, EmbeddedBusConfig):
        env |= {"ORCHARD_BUS__TYPE": "embedded", "ORCHARD_BUS__PATH": str(bus_config.path),
                "ORCHARD_BUS__SESSION_TIMEOUT_MS": str(bus_config.session_timeout_ms)}  # fmt: skip
    else:
        env |= {"ORCHARD_BUS__TYPE": "kafka", "ORCHARD_BUS__BOOTSTRAP_SERVERS": bus_config.bootstrap_servers}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_interleaved_episodes_become_exactly_their_trajectories_and_poison_is_dead_lettered(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str]
) -> None:
    namespace = unique_name("asm")
    episodes = [synthetic_episode(f"ep-{i}", calls=2 + i % 5, seed=i) for i in range(24)]
    lost = synthetic_episode("no-outcome", calls=2, seed=99)
    wrong_schema = CODEC.encode("StepScore", {"run_id": "r", "episode_id": "e", "call_index": 0, "scorer": "s",
                                              "policy_version": 1, "score": 1.0, "timestamp": 0})  # fmt: skip
    poison = [("model-calls", b"\xc3\x01garbage"), ("outcomes", wrong_schema)]
    publish(bus, namespace, interleaved(episodes) + lost.calls, poison)

    run_assembler(bus, bus_config, namespace, AssemblerConfig(outcome_timeout_s=1.0))

    records = decoded(bus, f"{namespace}.trajectories")
    by_episode = {r["episode_id"]: r for r in records}
    assert len(records) == len(by_episode) == len(episodes) + 1
    for episode in episodes:
        record = by_episode[episode.episode_id]
        assert (record["complete"], record["calls"], record["outcome"]) == (
            True, [c.value for c in episode.calls], episode.outcome.value,
        )  # fmt: skip
        assert len(trajectory_from_record(record).steps) == len(episode.calls)
    assert (by_episode["no-outcome"]["complete"], by_episode["no-outcome"]["incomplete_reason"]) == (
        False, "no outcome within 1s of the episode's latest model call (2 calls received)",
    )  # fmt: skip
    letters = sorted(decoded(bus, f"{namespace}.dead-letters"), key=lambda r: r["source_topic"])
    assert [(x["source_topic"], x["error_type"], x["consumer_group"]) for x in letters] == [
        ("model-calls", "CorruptRecordError", f"{namespace}.assembler"),
        ("outcomes", "SchemaMismatchError", f"{namespace}.assembler"),
    ]
    assert [x["original"] for x in letters] == [poison[0][1], poison[1][1]]


def test_a_plugin_reward_in_a_user_module_runs_through_the_cli(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    namespace = unique_name("plug")
    episodes = [synthetic_episode(f"p-{i}", calls=3, seed=i) for i in range(5)]
    publish(bus, namespace, interleaved(episodes))
    run_assembler(bus, bus_config, namespace)
    (tmp_path / "tests_module.py").write_text(textwrap.dedent(PLUGIN_MODULE))

    command = [str(ORCHARD), "consumer", "run", "tests_module:Reward", "--namespace", namespace,
               "--instance", "plugin-test", "--idle-exit", str(idle_exit(bus_config))]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env=cli_env(bus_config), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]

    scores = decoded(bus, f"{namespace}.scores")
    assert sorted((s["episode_id"], s["call_index"], s["scorer"], s["score"]) for s in scores) == [
        (e.episode_id, i, "token_count", 120.0) for e in episodes for i in range(3)
    ]


def publish_trajectories(bus: Bus, topic: str, episode_ids: list[str], timestamp_ms: int) -> None:
    """Assembled trajectories of synthetic 2-call episodes, published at ``timestamp_ms`` (bus record time)."""
    bus.create_topic(topic, 4, exist_ok=True)
    producer = bus.producer()
    for i, episode_id in enumerate(episode_ids):
        episode = synthetic_episode(episode_id, calls=2, seed=i)
        record = trajectory_record(
            run_id="synthetic", episode_id=episode_id, task_id="t", calls=[c.value for c in episode.calls],
            outcome=episode.outcome.value, outcome_fields=CODEC.decode(episode.outcome.value).record,
            policy_version=1, timestamp_ms=timestamp_ms,
        )  # fmt: skip
        producer.produce(topic, CODEC.encode("Trajectory", record), episode_id.encode(), timestamp_ms=timestamp_ms)
    producer.flush()


def test_a_reward_consumer_started_in_a_stage_scores_only_that_stages_trajectories(
    bus: Bus, bus_config: BusConfig, unique_name: Callable[[str], str], tmp_path: Path
) -> None:
    """``orchard consumer run ... --start stage``: a new group skips the trajectories of earlier stages and starts at
    ``$ORCHARD_STAGE_STARTED_MS`` (what ``orchard run`` passes); once it has committed, it resumes from its commits."""
    namespace = unique_name("stage")
    stage_started = int(time.time() * 1000) - 60_000
    publish_trajectories(bus, f"{namespace}.trajectories", ["old-0", "old-1", "old-2"], stage_started - 30_000)
    publish_trajectories(bus, f"{namespace}.trajectories", ["new-0", "new-1"], stage_started + 1_000)
    (tmp_path / "tests_module.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    command = [str(ORCHARD), "consumer", "run", "tests_module:Reward", "--namespace", namespace,
               "--instance", "stage-test", "--idle-exit", str(idle_exit(bus_config)), "--start", "stage"]  # fmt: skip

    refused = subprocess.run(command, cwd=tmp_path, env=cli_env(bus_config), capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert refused.returncode != 0 and "ORCHARD_STAGE_STARTED_MS" in refused.stderr + refused.stdout
    env = cli_env(bus_config) | {"ORCHARD_STAGE_STARTED_MS": str(stage_started)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted({s["episode_id"] for s in decoded(bus, f"{namespace}.scores")}) == ["new-0", "new-1"]

    publish_trajectories(bus, f"{namespace}.trajectories", ["late-0"], stage_started - 50_000)  # an old timestamp
    env[STAGE_STARTED_ENV] = str(stage_started + 3_600_000)  # committed offsets win over any start position
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted({s["episode_id"] for s in decoded(bus, f"{namespace}.scores")}) == ["late-0", "new-0", "new-1"]


def test_replay_is_deterministic_and_never_writes_the_originals(
    bus: Bus, unique_name: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = unique_name("rec")
    episodes = [synthetic_episode(f"r-{i}", calls=2 + i % 3, seed=i) for i in range(12)]
    publish(bus, source, interleaved(episodes) + synthetic_episode("cut", calls=2, seed=50).calls,
            [("model-calls", b"not avro")])  # fmt: skip
    (tmp_path / "replay_rewards.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {t: bus.describe_topic(t).end_offsets for t in bus.list_topics() if t.startswith(source)}

    first, second = unique_name("exp"), unique_name("exp")
    for namespace in (first, second):
        replay(bus, ["assembler", "replay_rewards:Reward"], namespace, source=source)

    def dump(namespace: str, topic: str) -> list[tuple]:
        """Every record where it is (partition, offset): the order partitions are fetched in is not the replay's."""
        records: list[Record] = list(read_topic(bus, f"{namespace}.{topic}", poll_timeout_s=0.3))
        return sorted((r.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in records)

    for topic in ("trajectories", "scores", "dead-letters"):
        assert dump(first, topic) == dump(second, topic), topic
    trajectories = decoded(bus, f"{first}.trajectories")
    # "cut" never got its outcome: the end-of-range drain flushes it as incomplete, with the reason
    assert sorted(t["episode_id"] for t in trajectories) == sorted([e.episode_id for e in episodes] + ["cut"])
    [cut] = [t for t in trajectories if t["episode_id"] == "cut"]
    assert not cut["complete"] and cut["incomplete_reason"]
    scored = [r for r in decoded(bus, f"{first}.scores") if r["episode_id"] != "cut"]
    assert len(scored) == sum(len(e.calls) for e in episodes)
    assert not any(math.isnan(r["score"]) for r in scored)
    assert len(dump(first, "dead-letters")) == 1
    after = {t: bus.describe_topic(t).end_offsets for t in bus.list_topics() if t.startswith(source)}
    assert after == before
    with pytest.raises(ReplayError, match="already used"):
        replay(bus, ["assembler"], first, source=source)
    undrained = unique_name("exp")
    replay(bus, ["assembler"], undrained, source=source, drain_ms=0)
    assert len(dump(undrained, "trajectories")) == len(episodes)  # without the drain, "cut" is still open
