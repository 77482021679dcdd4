"""How the Kafka bus rides out broker faults: which errors pass by themselves, the bounded retry of a request,
and the replication that lets a topic lose a broker.

Pure logic on librdkafka's error values (no client is opened here), so it is unit-tested without a broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from orchard.bus.exceptions import BusError, BusUnavailableError
from orchard.logging import get_logger

log = get_logger("bus.kafka")
T = TypeVar("T")
# Errors that pass by themselves: a broker not answering (stopped, restarting, paused), a leader or coordinator
# moving. librdkafka flags only some of them retriable (a watermark read's time-out and NOT_LEADER are not).
TRANSIENT_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._WAIT_COORD,
        KafkaError._RESOLVE,
        KafkaError._DESTROY_BROKER,  # a request queued on a broker handle librdkafka replaced (a broker restarted)
        KafkaError._NODE_UPDATE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_CONTROLLER,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.CONCURRENT_TRANSACTIONS,
    }
)
# A new topic's partitions may be unknown for a moment to the broker that answers.
SETTLING_CODES = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC})
FENCED_CODES = frozenset({KafkaError.FENCED_INSTANCE_ID, KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


def error_of(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` an exception carries (None for a future's ``TimeoutError``)."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error if isinstance(error, KafkaError) else None


def describe(exc: BaseException) -> str:
    """librdkafka's text of the error, or the exception's."""
    error = error_of(exc)
    return error.str() if error is not None else (str(exc) or type(exc).__name__)


def transient(error: KafkaError | None) -> bool:
    """Whether ``error`` may pass by itself, so the request is worth repeating (None: a time-out of our own)."""
    if error is None:
        return True
    return not error.fatal() and (error.retriable() or error.code() in TRANSIENT_CODES)


def transient_or_settling(error: KafkaError | None) -> bool:
    """``transient``, or a partition of a topic just created that the answering broker does not know yet."""
    return transient(error) or (error is not None and error.code() in SETTLING_CODES)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Repeat a request while its error is transient: pauses of ``backoff_s``, doubling up to ``max_backoff_s``,
    as long as the next attempt would start within ``total_s`` of the first (so the whole takes at most ``total_s``
    plus one request's own time-out); then raise ``BusUnavailableError`` naming the request, the time spent and the
    attempts.

    >>> [RetryPolicy(total_s=60, backoff_s=0.5, max_backoff_s=3).pause(n) for n in range(5)]
    [0.5, 1.0, 2.0, 3, 3]
    """

    total_s: float
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def pause(self, retry: int) -> float:
        """The pause before retry number ``retry`` (from 0)."""
        return min(self.max_backoff_s, self.backoff_s * 2**retry)

    def call(
        self,
        doing: str,
        request: Callable[[], T],
        *,
        retry_if: Callable[[KafkaError | None], bool] = transient,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> T:
        """``request()``, repeated as above; an error ``retry_if`` refuses is raised unchanged at once."""
        started, retry = clock(), 0
        while True:
            try:
                return request()
            except (KafkaException, TimeoutError) as exc:
                if not retry_if(error_of(exc)):
                    raise
                elapsed = clock() - started
                pause = self.pause(retry)
                if elapsed + pause > self.total_s:
                    raise BusUnavailableError(
                        f"cannot {doing}: still failing after {elapsed:.1f}s and {retry + 1} attempts "
                        f"(bus.retry_timeout_s={self.total_s:g}): {describe(exc)}"
                    ) from exc
                log.warning("Kafka request failed; retrying", doing=doing, attempt=retry + 1,
                            error=describe(exc), retry_in_s=round(pause, 2))  # fmt: skip
                sleep(pause)
                retry += 1


def choose_replication(brokers: int, replication: int | None = None, min_isr: int | None = None) -> tuple[int, int]:
    """Replication factor and ``min.insync.replicas`` of a new topic on a cluster of ``brokers``: 3 and 2 from
    three brokers on (a write survives one broker lost), else every broker and 1; explicit settings win.

    >>> choose_replication(5), choose_replication(3), choose_replication(2), choose_replication(1)
    ((3, 2), (3, 2), (2, 1), (1, 1))
    >>> choose_replication(5, replication=5), choose_replication(3, min_isr=3)
    ((5, 2), (3, 3))
    """
    factor = replication if replication is not None else max(1, min(3, brokers))
    return factor, min_isr if min_isr is not None else (2 if factor >= 3 else 1)


@contextmanager
def kafka_errors(doing: str) -> Iterator[None]:
    """Re-raise librdkafka's errors (and a request's time-out) as ``BusError``: ``cannot <doing>: <error>``."""
    try:
        yield
    except (KafkaException, TimeoutError) as exc:
        raise BusError(f"cannot {doing}: {describe(exc)}") from exc


def txn_retriable(error: KafkaError | None) -> bool:
    """Whether a transaction call may simply be made again (librdkafka's contract: retriable, not abortable)."""
    return error is not None and error.retriable() and not error.fatal() and not error.txn_requires_abort()


def known_brokers(metadata: Any) -> int:
    """Brokers of the cluster: those answering, and those holding a replica of a partition (a broker that is down
    while a topic is created still counts, so the topic does not get one replica fewer for good)."""
    ids = set(metadata.brokers)
    for topic in metadata.topics.values():
        for partition in topic.partitions.values():
            ids.update(partition.replicas)
    return len(ids)
