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

``CompleteSource`` is the trainer's ``SampleSource`` for such a stage: it replaces the stream's polling and every
idle rule; each pass queues the samples in its order and forms steps from that queue as a stream does, its last step
partial. Offsets stay at the stage's start until the stage is over; the checkpoint counts the samples of the pass
trained (``pass_position``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar

import numpy as np

from orchard.bus import Bus, Consumer, Record, TopicPartition
from orchard.bus.base import poll_through_self_fence
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.logging import get_logger
from trainers.checkpoint import Offsets, copy_offsets
from trainers.exceptions import TrainerError
from trainers.intake import SampleIntake
from trainers.sample_source import Queued, SampleSource, Step

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


class CompleteSource(SampleSource):
    """Steps from a complete input (``input: complete``): the stage's samples read first, then each pass's order."""

    def steps(self, consumer: Consumer, router: DeadLetterRouter, intake: SampleIntake) -> Iterator[Step]:
        """Read the stage's samples, then yield the steps of each pass over them, each full but the pass's last."""
        items = self._read_stage(consumer, router, intake)
        while not self.done():
            order = pass_order(items, self.config.order, self.config.seed, self.epoch)
            self._queue = deque(order[self.pass_position :])
            if not self._queue:
                self._end_pass()
            while self._queue and not self.done() and (step := self._form_step(full_only=False)) is not None:
                yield step

    def settle(self, step: Step, consumer: Consumer) -> None:
        """Count the step's samples into the pass; end the pass when its queue is empty, the stage at ``max_steps``."""
        self.pass_position += len(step.consumed)
        if not self._queue:
            self._end_pass()
        if self.at_max_steps() and not self.stage_done:
            self._end_stage()

    def _end_pass(self) -> None:
        self.epoch, self.pass_position = self.epoch + 1, 0
        self.passes_done += 1
        log.info("pass over the stage's samples done", epoch=self.epoch, of=self.config.epochs,
                 step=self.trainer_step())  # fmt: skip
        if self.epoch >= self.config.epochs:
            self._end_stage()

    def _read_stage(self, consumer: Consumer, router: DeadLetterRouter, intake: SampleIntake) -> list[Queued]:
        """Every valid sample of the stage, once each, in key order (a restart reads them quietly: judged before)."""
        resumed = self.epoch_end is not None
        ends = self.epoch_end or self.config.input_end
        start, end = stage_bounds(self.bus, consumer, self.config.topic, self.epoch_start, ends)
        self.epoch_start, self.epoch_end = _by_topic(start), _by_topic(end)
        self.consumed = copy_offsets(self.epoch_start)  # offsets stay at the stage's start until it is over
        items = []
        for record in read_to_end(consumer, end, self.config.poll_timeout_s):
            sample = intake.retake(record) if resumed else self._take(record, router, intake)
            if sample is not None:
                items.append(Queued(record.topic_partition, record.offset, sample))
        kept = unique_sorted(items, _item_key, lambda item: item.sample.sample_id if item.sample else "")
        log.info("stage samples read", samples=len(kept), duplicates=len(items) - len(kept), start=self.epoch_start,
                 end=self.epoch_end, epoch=self.epoch, pass_position=self.pass_position)  # fmt: skip
        return kept


def _by_topic(offsets: Bounds) -> Offsets:
    grouped: Offsets = {}
    for tp, offset in offsets.items():
        grouped.setdefault(tp.topic, {})[tp.partition] = offset
    return grouped


def _item_key(item: Queued) -> tuple[Any, ...]:
    """Key order, then the first delivery of a sample id (lowest partition and offset) first."""
    return (item.sample.key if item.sample else ("", "", ""), item.tp.partition, item.offset)
