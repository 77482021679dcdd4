"""A complete input (``input: complete``): every sample of a stage, read to where they end, in an order of their own.

A stage whose samples are all on the topic before it starts (their producers are done: ``orchard run`` ends the stage
before it only once its sample builders have caught up, ``until: {caught_up: [...]}``) needs none of the stream's
timing rules. Its trainer:

1. takes where the stage's samples end: a restart's checkpoint (``epoch_end``), else ``input_end``, else the topic's
   end offsets when it starts; and where they begin: its checkpoint's offsets, else the beginning of the topic;
2. reads every record in between, however late or in whatever order they were delivered, until its position has
   reached the end of every partition (it waits as long as that takes: no idle timeout decides what is read);
3. keeps the valid samples of its run, one per ``sample_id``, sorted by ``Sample.key`` (task, episode, sample id);
4. trains each pass in ``pass_order``: that sorted list, or a permutation of it seeded by (seed, pass).

So which samples a stage trains, their order and its number of steps depend on the samples alone: the steps of a
pass follow from the samples' lengths and ``batch_tokens * grad_accum`` (and from staleness, judged against versions
that follow the steps too), capped by ``max_steps``. A stage holds its samples in memory while it trains.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from orchard.bus import Bus, Consumer, Record, TopicPartition
from orchard.bus.base import poll_through_self_fence
from orchard.logging import get_logger
from trainers.checkpoint import Offsets
from trainers.exceptions import TrainerError

log = get_logger("trainers.stage_input")

T = TypeVar("T")
WAIT_LOG_S = 30.0  # how often a trainer still waiting for its stage's samples says so


Bounds = dict[TopicPartition, int]


def stage_bounds(
    bus: Bus, consumer: Consumer, topic: str, start: Offsets, end: Offsets | None
) -> tuple[Bounds, Bounds]:
    """Where the stage's samples begin (``start``, else the topic's beginning) and end (``end``, else the topic's end)
    in each partition of ``topic``; the consumer is sought to the beginnings."""
    info = bus.describe_topic(topic)
    ends = (end or {topic: info.end_offsets}).get(topic, {})
    first, last = {}, {}
    for partition in range(info.partitions):
        tp = TopicPartition(topic, partition)
        first[tp] = start.get(topic, {}).get(partition, info.start_offsets.get(partition, 0))
        last[tp] = ends.get(partition, first[tp])
        if last[tp] < first[tp]:
            raise TrainerError(
                f"input_end: {topic}[{partition}] ends at {last[tp]}, before the stage's start {first[tp]}"
            )
        consumer.seek(tp, first[tp])
    return first, last


def read_to_end(
    consumer: Consumer,
    end: Mapping[TopicPartition, int],
    poll_timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Record]:
    """The records before ``end`` from the consumer's position on, once each; returns when every partition's
    position has reached its end. The position, not an empty poll, says so: a Kafka fetch can lag behind a backlog,
    and transaction markers take offsets no record is returned for."""
    next_log = clock() + WAIT_LOG_S
    while True:
        position = consumer.position()
        behind = {tp: end[tp] - position.get(tp, 0) for tp in end if position.get(tp, -1) < end[tp]}
        if not behind:
            return
        if clock() >= next_log:
            next_log = clock() + WAIT_LOG_S
            log.info(
                "waiting for the stage's samples", behind={f"{tp.topic}[{tp.partition}]": n for tp, n in behind.items()}
            )
        for record in poll_through_self_fence(consumer, max_records=256, timeout_s=poll_timeout_s):
            if record.offset < end.get(record.topic_partition, 0):
                yield record


def unique_sorted(
    items: Iterable[T], key: Callable[[T], tuple[Any, ...]], identity: Callable[[T], Hashable]
) -> list[T]:
    """``items`` sorted by ``key``, the first of each ``identity`` kept (a sample delivered twice trains once)."""
    seen: set[Hashable] = set()
    kept = []
    for item in sorted(items, key=key):
        if identity(item) not in seen:
            seen.add(identity(item))
            kept.append(item)
    return kept


def pass_order(items: Sequence[T], order: Literal["shuffle", "key"], seed: int, pass_index: int) -> list[T]:
    """The order of pass ``pass_index`` over ``items`` (already in key order): as they are, or seeded by (seed, pass).

    >>> pass_order(["a", "b", "c"], "key", 0, 1)
    ['a', 'b', 'c']
    >>> pass_order(["a", "b", "c"], "shuffle", 0, 1) == pass_order(["a", "b", "c"], "shuffle", 0, 1)
    True
    """
    if order == "key":
        return list(items)
    permutation = np.random.default_rng([seed, pass_index]).permutation(len(items))
    return [items[int(i)] for i in permutation]
