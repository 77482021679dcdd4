"""The Kafka transactional producer's error handling, on a scripted librdkafka producer: retriable calls are made
again, abortable ones abort, a fatal error brings a fresh producer at the next begin, a fenced one does not."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from orchard.bus import TransactionError
from orchard.bus.kafka import KafkaTransactionalProducer
from orchard.bus.kafka_faults import RetryPolicy


class ScriptedRaw:
    """A stand-in for confluent_kafka.Producer whose transaction calls raise the scripted errors in turn."""

    def __init__(self, name: str, commit_errors: list[KafkaError] | None = None) -> None:
        self.name = name
        self.commit_errors = list(commit_errors or [])
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")
        if self.name == "fenced":
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        if self.commit_errors:
            raise KafkaException(self.commit_errors.pop(0))

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


class FakeBus:
    """What the producer uses of ``KafkaBus``: its config, its retry policy and new transactional producers."""

    def __init__(self, successors: list[ScriptedRaw]) -> None:
        self.config = SimpleNamespace(max_record_bytes=1_000_000, connect_timeout_s=1.0)
        self.retry = RetryPolicy(total_s=5, backoff_s=0.001, max_backoff_s=0.001)
        self.successors = successors
        self.initialised: list[str] = []

    def init_transactional(self, transactional_id: str) -> ScriptedRaw:
        self.initialised.append(transactional_id)
        return self.successors.pop(0)


def producer_on(raw: ScriptedRaw, successors: list[ScriptedRaw] | None = None) -> tuple[Any, FakeBus]:
    bus = FakeBus(successors or [])
    return KafkaTransactionalProducer(bus, raw, "assembler.host-1"), bus  # type: ignore[arg-type]


def test_a_retriable_commit_error_is_retried_until_it_commits() -> None:
    raw = ScriptedRaw("first", [KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)] * 2)
    producer, bus = producer_on(raw)
    producer.begin()
    producer.commit()
    assert (raw.calls, bus.initialised) == (["begin", "commit", "commit", "commit"], [])


def test_an_abortable_commit_error_aborts_and_the_same_producer_goes_on() -> None:
    raw = ScriptedRaw("first", [KafkaError(KafkaError.INVALID_TXN_STATE, "abortable", txn_requires_abort=True)])
    producer, bus = producer_on(raw)
    producer.begin()
    with pytest.raises(TransactionError, match="transaction aborted: abortable"):
        producer.commit()
    producer.begin()
    assert (raw.calls, bus.initialised) == (["begin", "commit", "abort", "begin"], [])


def test_after_a_fatal_error_the_next_begin_takes_a_fresh_producer_with_the_same_id() -> None:
    broken = ScriptedRaw("broken", [KafkaError(KafkaError._INCONSISTENT, "fatal", fatal=True)])
    fresh = ScriptedRaw("fresh")
    producer, bus = producer_on(broken, [fresh])
    producer.begin()
    with pytest.raises(TransactionError, match="transaction aborted: fatal"):
        producer.commit()
    producer.begin()
    producer.commit()
    assert (broken.calls, fresh.calls, bus.initialised) == (
        ["begin", "commit"],
        ["begin", "commit"],
        ["assembler.host-1"],
    )


def test_a_fenced_producer_is_not_replaced() -> None:
    producer, bus = producer_on(ScriptedRaw("fenced"), [ScriptedRaw("fresh")])
    for _ in range(2):
        with pytest.raises(TransactionError, match="cannot begin a transaction: fenced"):
            producer.begin()
    assert bus.initialised == []
