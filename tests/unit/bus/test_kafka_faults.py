"""The Kafka bus's fault policy as pure logic: which errors are retried, for how long, and topic replication."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from orchard.bus import BusUnavailableError
from orchard.bus.exceptions import MemberFencedError
from orchard.bus.kafka import SELF_FENCE_WINDOW_S, KafkaConsumer
from orchard.bus.kafka_faults import (
    RetryPolicy,
    choose_replication,
    known_brokers,
    transient,
    transient_or_settling,
    txn_retriable,
)
from orchard.config import KafkaBusConfig


class FakeTime:
    """A clock that only moves when slept on or when a request takes time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def failing(time: FakeTime, errors: list[BaseException], takes_s: float = 0.0) -> Callable[[], str]:
    """A request raising ``errors`` in turn (each after ``takes_s``), then answering "ok"."""
    remaining = list(errors)

    def request() -> str:
        time.now += takes_s
        if remaining:
            raise remaining.pop(0)
        return "ok"

    return request


def kafka_error(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, f"error {code}", **flags))


def test_timeouts_are_ridden_out_with_doubling_pauses() -> None:
    time = FakeTime()
    errors: list[BaseException] = [kafka_error(KafkaError._TIMED_OUT) for _ in range(3)] + [TimeoutError()]
    policy = RetryPolicy(total_s=60, backoff_s=0.5, max_backoff_s=1.5)
    answer = policy.call("read offsets of t[0]", failing(time, errors), clock=time.clock, sleep=time.sleep)
    assert (answer, time.pauses) == ("ok", [0.5, 1.0, 1.5, 1.5])


def test_giving_up_names_the_request_the_time_spent_and_the_attempts() -> None:
    time = FakeTime()
    request = failing(time, [kafka_error(KafkaError._TIMED_OUT) for _ in range(10)], takes_s=10.0)
    policy = RetryPolicy(total_s=25, backoff_s=1, max_backoff_s=1)
    with pytest.raises(BusUnavailableError) as raised:
        policy.call("read offsets of samples[3]", request, clock=time.clock, sleep=time.sleep)
    assert str(raised.value) == (
        "cannot read offsets of samples[3]: still failing after 32.0s and 3 attempts (bus.retry_timeout_s=25): "
        "error -185"
    )
    assert time.pauses == [1, 1]


def test_a_permanent_or_fatal_error_is_raised_unchanged_at_once() -> None:
    for error in (kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED), kafka_error(KafkaError._TIMED_OUT, fatal=True)):
        time = FakeTime()
        with pytest.raises(KafkaException) as raised:
            RetryPolicy(total_s=60).call("list topics", failing(time, [error]), clock=time.clock, sleep=time.sleep)
        assert (raised.value, time.pauses) == (error, [])


def test_no_retry_budget_means_one_attempt() -> None:
    time = FakeTime()
    with pytest.raises(BusUnavailableError, match="after 0.0s and 1 attempts"):
        RetryPolicy(total_s=0).call(
            "list topics", failing(time, [kafka_error(KafkaError._TRANSPORT)]), clock=time.clock, sleep=time.sleep
        )


@pytest.mark.parametrize(
    ("code", "flags", "expected"),
    [
        (KafkaError._TIMED_OUT, {}, (True, True, False)),
        (KafkaError._TIMED_OUT, {"retriable": True}, (True, True, True)),
        (KafkaError.NOT_LEADER_FOR_PARTITION, {}, (True, True, False)),
        (KafkaError.COORDINATOR_NOT_AVAILABLE, {}, (True, True, False)),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, {}, (False, True, False)),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, {}, (False, False, False)),
        (KafkaError._TIMED_OUT, {"fatal": True}, (False, False, False)),
        (KafkaError._TIMED_OUT, {"retriable": True, "txn_requires_abort": True}, (True, True, False)),
    ],
)
def test_which_errors_are_retried(code: int, flags: dict[str, bool], expected: tuple[bool, bool, bool]) -> None:
    error = KafkaError(code, "x", **flags)
    assert (transient(error), transient_or_settling(error), txn_retriable(error)) == expected


def test_a_future_timing_out_is_transient_but_not_a_transaction_retry() -> None:
    assert (transient(None), transient_or_settling(None), txn_retriable(None)) == (True, True, False)


@pytest.mark.parametrize(
    ("brokers", "replication", "min_isr", "expected"),
    [
        (1, None, None, (1, 1)),
        (2, None, None, (2, 1)),
        (3, None, None, (3, 2)),
        (6, None, None, (3, 2)),
        (0, None, None, (1, 1)),
        (6, 5, None, (5, 2)),
        (3, 2, None, (2, 1)),
        (3, None, 3, (3, 3)),
        (1, 3, 2, (3, 2)),
    ],
)
def test_replication_follows_the_broker_count_unless_configured(
    brokers: int, replication: int | None, min_isr: int | None, expected: tuple[int, int]
) -> None:
    assert choose_replication(brokers, replication, min_isr) == expected


def test_brokers_that_are_down_but_hold_replicas_still_count() -> None:
    partition = SimpleNamespace(replicas=[1, 2, 3])
    metadata = SimpleNamespace(
        brokers={1: object(), 2: object()}, topics={"t": SimpleNamespace(partitions={0: partition})}
    )
    assert known_brokers(metadata) == 3


def test_config_refuses_a_min_isr_above_the_replication() -> None:
    with pytest.raises(ValidationError, match=r"min_insync_replicas \(3\) exceeds replication_factor \(2\)"):
        KafkaBusConfig(bootstrap_servers="b:9092", replication_factor=2, min_insync_replicas=3)
    defaults = KafkaBusConfig(bootstrap_servers="b:9092")
    assert (defaults.replication_factor, defaults.min_insync_replicas, defaults.retry_timeout_s) == (None, None, 120.0)


def fenced_consumer(lost_s_ago: float | None) -> KafkaConsumer:
    """A Kafka consumer's fence bookkeeping alone (no client): its session lost that long ago, or never."""
    consumer = object.__new__(KafkaConsumer)
    consumer.group, consumer.instance_id = "g", "g.one"
    consumer._lost_at = -math.inf if lost_s_ago is None else time.monotonic() - lost_s_ago
    return consumer


FENCE = KafkaError(KafkaError.FENCED_INSTANCE_ID, "Static consumer fenced by other consumer", fatal=True)


def test_a_fence_soon_after_the_members_own_session_time_out_is_self_inflicted() -> None:
    with pytest.raises(MemberFencedError, match="fenced by its own earlier membership") as fenced:
        fenced_consumer(lost_s_ago=3.0)._check_error(FENCE)
    assert fenced.value.by_another is False


@pytest.mark.parametrize("lost_s_ago", [None, SELF_FENCE_WINDOW_S + 5])
def test_a_fence_with_no_recent_session_time_out_is_another_consumers(lost_s_ago: float | None) -> None:
    with pytest.raises(MemberFencedError, match="another consumer joined the group") as fenced:
        fenced_consumer(lost_s_ago)._check_error(FENCE)
    assert fenced.value.by_another is True
