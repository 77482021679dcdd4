"""``SampleSource``: the samples a policy trainer takes its steps from, and how far into its stage it has got.

A source yields one ``Step`` at a time; the trainer trains it and then calls ``settle``, which marks the step's records
trained and ends the pass or the stage when it ended there (before the step's checkpoint, which must record that).
Two sources share this base: ``StreamSource`` (below; ``input: stream``) and ``trainers.stage_input.CompleteSource``
(``input: complete``).

On a stream:

1. **poll** (at most ``poll_timeout_s``), decode each record into a ``Sample`` (``trainers.intake``: undecodable or
   inconsistent records are dead-lettered and skipped), and queue it in arrival order;
2. **form a step**: take queued samples in order until the next one would overflow ``batch_tokens * grad_accum``;
   each sample's staleness is judged now, against the current version (dropped or down-weighted); the step's samples
   are sorted by key; a partial step is taken once the stream has been idle ``idle_flush_s``.

Offsets: a step always takes a prefix of the queue, so the records trained are, in every partition, a prefix of what
was polled; the checkpoint stores the offset after that prefix. Bitwise reproducibility across a crash (with
``deterministic`` on CPU) also needs the records to arrive in the same order, which holds within a partition: a
multi-partition topic interleaves partitions by timing.

Epochs: with ``epochs > 1`` the first pass ends like a single-pass run (the stream idle for ``idle_exit_s``, nothing
queued); the source then records where it ended, seeks its consumer back to the offsets the stage started from and
yields the same records again (records past the first pass's end are left for the next stage), until ``epochs``
passes are done or ``max_steps`` is reached. A replayed pass flushes its last partial step as soon as every record of
the pass is queued. The pass, the stage's start and the first pass's end are in the checkpoint, so a restart mid-pass
resumes that pass; a stage that is over checkpoints as "between stages" (pass 0 from its end offsets), which is where
the next stage's trainer (same run and model name) starts.

A drain (``request_drain``, SIGTERM in ``orchard train policy``) trains what was on the topic when it was asked for,
the last step partial, and ends the stage's steps.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from orchard.bus import Bus, Consumer, Record, TopicPartition
from orchard.bus.base import poll_through_self_fence
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.logging import get_logger
from trainers.batching import Sample
from trainers.checkpoint import Offsets, TrainerState, copy_offsets
from trainers.config import PolicyTrainerConfig
from trainers.intake import SampleIntake
from trainers.staleness import LagStats, StalenessCheck

log = get_logger("trainers.sample_source")


@dataclass
class Queued:
    """A polled record waiting for a step: its position, and its sample (None if it was skipped)."""

    tp: TopicPartition
    offset: int
    sample: Sample | None


@dataclass
class Step:
    """The records one optimizer step consumes, the samples it trains on, and their lags.

    ``idle`` marks no step at all but the news that a stream's input ran dry (``publish_on_idle``): nothing queued,
    nothing arrived for ``idle_flush_s``. ``round_end`` marks no step either but the end of a lockstep round
    (``trainers.round_input``): the trainer publishes the version trained on it.
    """

    consumed: list[Queued]
    samples: list[Sample]
    lags: LagStats
    idle: bool = False
    round_end: int | None = None
    relabel: bool = False
    """No step either: ``samples`` are a lockstep round's, whose behaviour logprobs the trainer recomputes
    (``loss.behaviour_logprobs: trainer``) and hands back through the source's ``relabel``."""


class SampleSource(ABC):
    """The queue a trainer's steps are taken from, and its place in the stage: offsets trained, pass, stage's ends.

    ``trainer_step`` and ``trainer_version`` read the trainer's optimizer step (``max_steps`` ends the stage's steps)
    and its policy version (what staleness is judged against): both belong to the trainer and change as it trains.
    """

    schedules_outputs = True
    """Whether the trainer publishes and checkpoints every ``publish_every`` / ``checkpoint_every`` steps (a source
    that decides when itself, as lockstep rounds do, says no)."""

    def __init__(
        self,
        config: PolicyTrainerConfig,
        bus: Bus,
        *,
        trainer_step: Callable[[], int],
        trainer_version: Callable[[], int],
    ) -> None:
        self.config = config
        self.bus = bus
        self.trainer_step = trainer_step
        self.trainer_version = trainer_version
        self.staleness = StalenessCheck(
            config.staleness.max_policy_lag, config.staleness.policy, config.staleness.decay
        )
        self.consumed: Offsets = {}
        self.epoch = 0  # the pass over the stage's samples, from 0
        self.epoch_start: Offsets = {}  # where the stage started: each pass seeks back here
        self.epoch_end: Offsets | None = None  # where the first pass ended (known from the second pass on)
        self.pass_position = 0  # complete input: samples of the current pass trained, in its order
        self.stage_done = False
        self.passes_done = 0  # passes over the stage's samples this process completed
        self._queue: deque[Queued] = deque()
        self._drain_requested = threading.Event()

    @abstractmethod
    def steps(self, consumer: Consumer, router: DeadLetterRouter, intake: SampleIntake) -> Iterator[Step]:
        """The stage's steps, one at a time, until it is over, ``max_steps`` is reached or the input ends."""

    @abstractmethod
    def settle(self, step: Step, consumer: Consumer) -> None:
        """After ``step`` was trained: its records count as trained; the pass or the stage may end here."""

    def request_drain(self) -> None:
        """Train what is on the topic now, then end (a stream's steps). Thread-safe."""
        self._drain_requested.set()

    def at_max_steps(self) -> bool:
        """Whether the trainer has taken ``max_steps``."""
        return self.config.max_steps is not None and self.trainer_step() >= self.config.max_steps

    def done(self) -> bool:
        """Whether the stage is over or the trainer has taken ``max_steps``."""
        return self.stage_done or self.at_max_steps()

    @property
    def multi_pass(self) -> bool:
        """Whether the checkpoint carries the pass and the stage's offsets (several passes, or a complete input)."""
        return self.config.epochs > 1 or self.config.input == "complete"

    # ------------------------------------------------------------------------------------------------ checkpoints

    def offsets(self) -> Offsets:
        """A copy of the offsets trained up to, per topic and partition."""
        return copy_offsets(self.consumed)

    def record_position(self, state: TrainerState) -> None:
        """Write the pass and the stage's offsets into a checkpoint's ``state`` (unset between stages)."""
        if self.multi_pass and not self.stage_done:
            state.epoch, state.epoch_start = self.epoch, copy_offsets(self.epoch_start)
            state.epoch_end = copy_offsets(self.epoch_end) if self.epoch_end is not None else None
            state.pass_position = self.pass_position

    def resume(self, state: TrainerState, consumer: Consumer) -> None:
        """Take up where a checkpoint's ``state`` left off, and seek the consumer to its offsets."""
        self.consumed = state.offsets
        if self.multi_pass:  # a checkpoint between stages (or older than epochs) starts a stage here
            self.epoch = state.epoch
            self.epoch_start = copy_offsets(state.epoch_start if state.epoch_start is not None else state.offsets)
            self.epoch_end = copy_offsets(state.epoch_end) if state.epoch_end is not None else None
            self.pass_position = state.pass_position if self.epoch_end is not None else 0
        for topic, partitions in state.offsets.items():
            for partition, offset in partitions.items():
                consumer.seek(TopicPartition(topic, partition), offset)

    def commit_if_settled(self, consumer: Consumer) -> None:
        """Commit the group's offsets when they equal the checkpoint's (nothing polled is still queued).

        The checkpoint is the record of what was trained; the group's offsets only show the lag to monitoring, so
        they are never moved past it; nor back during a replayed pass.
        """
        if self.epoch > 0:
            return
        position = consumer.position()
        checkpointed = {TopicPartition(t, p): o for t, parts in self.consumed.items() for p, o in parts.items()}
        if all(checkpointed.get(tp, -1) == offset for tp, offset in position.items()):
            consumer.commit()

    # ------------------------------------------------------------------------------------------------ steps

    def _take(self, record: Record, router: DeadLetterRouter, intake: SampleIntake) -> Sample | None:
        return intake.retake(record) if self.epoch > 0 else intake.take(record, router)

    def _form_step(self, *, full_only: bool) -> Step | None:
        """The next step from the head of the queue; None if ``full_only`` and the budget is not filled yet."""
        budget, tokens, kept, lags = self.config.step_tokens, 0, [], LagStats()
        version = self.trainer_version()
        cut = len(self._queue)
        for index, queued in enumerate(self._queue):
            if queued.sample is None:
                continue
            verdict = self.staleness.judge(queued.sample.policy_version, version)
            if verdict.keep and kept and tokens + queued.sample.num_tokens > budget:
                cut = index
                break
            lags.add(verdict)
            if verdict.keep:
                kept.append(replace(queued.sample, weight=verdict.weight))
                tokens += queued.sample.num_tokens
        else:
            if full_only and tokens < budget:
                return None
        consumed = [self._queue.popleft() for _ in range(cut)]
        return Step(consumed, sorted(kept, key=lambda sample: sample.key), lags)

    def _end_stage(self) -> None:
        """The stage is over: offsets at the first pass's end, and the state reads "pass 0 of the next stage"."""
        for topic, parts in (self.epoch_end or {}).items():
            for partition, end in parts.items():
                mine = self.consumed.setdefault(topic, {})
                mine[partition] = max(mine.get(partition, 0), end)
        self.epoch, self.epoch_start, self.epoch_end, self.pass_position = 0, copy_offsets(self.consumed), None, 0
        self.stage_done = True


class StreamSource(SampleSource):
    """Steps from records as they arrive (``input: stream``): full steps, and partial ones when the stream pauses."""

    _drain_ends: dict[int, int] | None = None  # the topic's end offsets when a drain was asked for

    def steps(self, consumer: Consumer, router: DeadLetterRouter, intake: SampleIntake) -> Iterator[Step]:
        """Poll, queue, and yield each step as it fills; a partial one after ``idle_flush_s``, at the end of a
        replayed pass and on a drain; end on a drain, at ``idle_exit_s`` (the first pass) or after the last pass."""
        last_arrival, told_idle = time.monotonic(), False
        while not self.done():
            if self._replay_complete():  # restored at the very end of a replayed pass
                self._next_epoch(consumer)
                continue
            records = poll_through_self_fence(consumer, max_records=256, timeout_s=self.config.poll_timeout_s)
            if records:
                last_arrival, told_idle = time.monotonic(), False
                self._enqueue(records, router, intake)
            while not self.done() and (step := self._form_step(full_only=True)) is not None:
                yield step
            while not self.done() and self._queue and self._replay_fully_queued():
                step = self._form_step(full_only=False)
                if step is not None:
                    yield step
            idle = time.monotonic() - last_arrival
            if not self.done() and not records and self._queue and idle >= self.config.idle_flush_s:
                step = self._form_step(full_only=False)
                if step is not None:
                    yield step
            if (self.config.publish_on_idle and self.epoch == 0 and not told_idle and not records and not self._queue
                    and idle >= self.config.idle_flush_s and not self.done()):  # fmt: skip
                # once per dry spell, in the first pass only (a replay's input does not run dry, it ends): the
                # trainer publishes what it trained, if anything
                told_idle = True
                yield Step(consumed=[], samples=[], lags=LagStats(), idle=True)
            if self._drain_requested.is_set() and self.epoch == 0 and self._drained(consumer):
                while not self.done() and self._queue and (step := self._form_step(full_only=False)) is not None:
                    yield step
                log.info("drained on request, exiting", step=self.trainer_step(), queued=len(self._queue))
                return
            idle_exit = self.config.idle_exit_s
            if self.epoch == 0 and idle_exit is not None and not self._queue and idle >= idle_exit:
                if self.config.epochs == 1:
                    log.info("stream idle, exiting", idle_s=round(idle, 1), step=self.trainer_step())
                    return
                log.info("stream idle, first pass done", idle_s=round(idle, 1), step=self.trainer_step())
                self._next_epoch(consumer)
                last_arrival = time.monotonic()

    def settle(self, step: Step, consumer: Consumer) -> None:
        """Mark the step's records trained; end the pass (a replay that reached the first pass's end) or, at
        ``max_steps`` with several passes, the stage."""
        self._mark_consumed(step.consumed)
        if self._replay_complete():
            self._next_epoch(consumer)
        if self.at_max_steps() and self.config.epochs > 1:
            self._end_stage()

    def _drained(self, consumer: Consumer) -> bool:
        """Whether every record that was on the topic when the drain was asked for has been polled."""
        if self._drain_ends is None:
            self._drain_ends = dict(self.bus.describe_topic(self.config.topic).end_offsets)
        position = {tp.partition: offset for tp, offset in consumer.position().items() if tp.topic == self.config.topic}
        return all(position.get(partition, 0) >= end for partition, end in self._drain_ends.items() if end > 0)

    def _enqueue(self, records: list[Record], router: DeadLetterRouter, intake: SampleIntake) -> None:
        for record in records:
            tp = record.topic_partition
            if self.epoch == 0:
                self.epoch_start.setdefault(tp.topic, {}).setdefault(tp.partition, record.offset)
            elif self.epoch_end is not None and record.offset >= self.epoch_end.get(tp.topic, {}).get(tp.partition, 0):
                continue  # arrived after the first pass: the next stage's
            self._queue.append(Queued(tp, record.offset, self._take(record, router, intake)))

    def _mark_consumed(self, consumed: list[Queued]) -> None:
        for queued in consumed:
            self.consumed.setdefault(queued.tp.topic, {})[queued.tp.partition] = queued.offset + 1

    # ------------------------------------------------------------------------------------------------ epochs

    def _replay_complete(self) -> bool:
        """A replayed pass has trained every record up to where the first pass ended."""
        if self.epoch == 0 or self.epoch_end is None or self._queue:
            return False
        return all(
            self._consumed_at(topic, partition) >= end
            for topic, parts in self.epoch_end.items()
            for partition, end in parts.items()
        )

    def _replay_fully_queued(self) -> bool:
        """Every record of a replayed pass is queued: its last partial step need not wait for the idle flush."""
        if self.epoch == 0 or self.epoch_end is None:
            return False
        queued: dict[TopicPartition, int] = {}
        for item in self._queue:
            queued[item.tp] = max(queued.get(item.tp, 0), item.offset + 1)
        return all(
            queued.get(TopicPartition(topic, partition), self._consumed_at(topic, partition)) >= end
            for topic, parts in self.epoch_end.items()
            for partition, end in parts.items()
        )

    def _consumed_at(self, topic: str, partition: int) -> int:
        return self.consumed.get(topic, {}).get(partition, self.epoch_start.get(topic, {}).get(partition, 0))

    def _next_epoch(self, consumer: Consumer) -> None:
        """End the current pass: seek back to the stage's start for the next one, or end the stage."""
        self.epoch += 1
        self.passes_done += 1
        if self.epoch >= self.config.epochs:
            log.info("last pass done", epochs=self.config.epochs, step=self.trainer_step())
            self._end_stage()
            return
        if self.epoch_end is None:
            self.epoch_end = copy_offsets(self.consumed)
        self._queue.clear()  # empty at a pass's end; records past epoch_end are never queued in a replay
        for topic, parts in self.epoch_start.items():
            for partition, offset in parts.items():
                consumer.seek(TopicPartition(topic, partition), offset)
                self.consumed.setdefault(topic, {})[partition] = offset
        log.info("pass over the stage's samples", epoch=self.epoch, of=self.config.epochs, start=self.epoch_start)
