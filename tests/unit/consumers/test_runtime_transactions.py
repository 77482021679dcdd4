"""Transactions of several polls: polls that find records waiting share one transaction (up to its interval or
record count), an empty poll commits it, and a partition moved back while one is open drops it and redoes its
records from the committed offsets, so a processor that is not idempotent still emits each record's output once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from consumers.config import RuntimeConfig
from consumers.processor import Emit, Input, Processor
from consumers.runtime import ConsumerRuntime, read_topic
from consumers.synthetic import synthetic_episode
from orchard.bus import Bus, Consumer, TopicPartition, open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig

EPISODES = 40


class Copier(Processor):
    """Emits a copy of every outcome: a second pass over a record would show as a second copy."""

    name: ClassVar[str] = "copier"
    input_topics: ClassVar[tuple[str, ...]] = ("outcomes",)
    output_topics: ClassVar[tuple[str, ...]] = ("copies",)

    def process(self, message: Input, emit: Emit) -> None:
        emit("copies", message.schema, message.record, message.key)


def published(tmp_path: Path) -> Bus:
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    bus.create_topic("t.outcomes", 4)
    producer = bus.producer()
    for i in range(EPISODES):
        outcome = synthetic_episode(f"e-{i}", calls=1, seed=i, first_prompt_tokens=20).outcome
        producer.produce("t.outcomes", outcome.value, outcome.key)
    producer.flush()
    return bus


def run(bus: Bus, **config: Any) -> tuple[ConsumerRuntime, list[str]]:
    settings = RuntimeConfig(max_poll_records=5, poll_timeout_s=0.1, **config)
    runtime = ConsumerRuntime(bus, Copier(), namespace="t", instance_id="one", config=settings, clock=lambda: 0)
    runtime.run(idle_exit_s=0.3)
    copies = [Codec.default().decode(r.value).record["episode_id"] for r in read_topic(bus, "t.copies")]
    return runtime, sorted(copies)


def test_polls_share_a_transaction_up_to_its_record_count(tmp_path: Path) -> None:
    runtime, copies = run(published(tmp_path), transaction_interval_s=10.0, transaction_max_records=20)
    assert copies == sorted(f"e-{i}" for i in range(EPISODES))
    assert (runtime.stats.transactions, runtime.stats.aborted_batches, runtime.stats.committed_in) == (2, 0, 40)


def test_an_interval_of_zero_commits_every_poll(tmp_path: Path) -> None:
    runtime, copies = run(published(tmp_path), transaction_interval_s=0.0)
    assert copies == sorted(f"e-{i}" for i in range(EPISODES))
    assert runtime.stats.transactions == EPISODES // 5


def test_a_partition_moved_back_mid_transaction_drops_it_and_redoes_its_records_once(tmp_path: Path) -> None:
    bus = published(tmp_path)
    make_consumer = bus.consumer
    polls = 0

    def rewinding(*args: Any, **kwargs: Any) -> Consumer:
        consumer = make_consumer(*args, **kwargs)
        poll = consumer.poll

        def poll_then_rewind(max_records: int = 500, timeout_s: float = 1.0) -> list:
            nonlocal polls
            polls += 1
            if polls == 3:  # two polls into the first transaction: as if a rebalance rewound partition 0
                consumer.seek(TopicPartition("t.outcomes", 0), 0)
            return poll(max_records, timeout_s)

        consumer.poll = poll_then_rewind  # type: ignore[method-assign]
        return consumer

    bus.consumer = rewinding  # type: ignore[method-assign]
    runtime, copies = run(bus, transaction_interval_s=10.0, transaction_max_records=20)
    assert copies == sorted(f"e-{i}" for i in range(EPISODES))
    assert (runtime.stats.aborted_batches, runtime.stats.committed_in) == (1, EPISODES)  # the dropped ones once
