"""Lockstep rounds (``input: rounds``): each rollout round's samples trained whole, in key order, then one version.

A lockstep rollout scheduler (``producers.rollout.scheduler``, ``lockstep``) announces round *r* on
``rollout-rounds`` only once every episode of the round has ended and the pipeline's consumer groups are done with
what is on their topics: every sample the round will make is then on the samples topic. On that record this source:

1. takes where the round's samples end on the samples topic: the end offsets the announcement carries (the topic's
   ends when the pipeline had made them), so a trainer restarted later reads exactly the same records;
2. reads from where the last round ended up to those ends (however late or in whatever order the records arrive;
   the position, not an idle time, says when it has them all) and keeps the valid samples of its run, one per
   ``sample_id``, sorted by ``Sample.key`` (task, episode, sample id);
3. yields that list as steps of ``batch_tokens * grad_accum`` tokens, the last one partial, ``epochs`` times over in
   the same order (PPO's epochs: the behaviour logprobs stay the round's, so a later pass is clipped against the
   weights the round was sampled with), then a ``Step`` marked ``round_end``: the trainer publishes a version whose
   ``metrics["rollout_round"]`` is *r* (even when the round gave nothing to train: the scheduler waits for it) and
   checkpoints.

So which samples a round trains, their order, its steps and the version after it depend on the samples alone, not
on when they arrived or how busy the machine was. ``publish_every`` and ``checkpoint_every`` do not apply: a version
and a checkpoint per round. The checkpoint holds the round's end offsets and the round (``TrainerState.round``); a
restart mid-round starts the round again from the previous one's end, so no sample is trained twice, and a trainer
of the next stage (same run and model name) continues with the next round. A round record the trainer has trained
already (a replay of the topic after a restart) is skipped.

A round's records are read with the trainer's own offsets as the start: one before it (a group rejoin that rewound
the consumer) is dropped. A drain (SIGTERM) trains every round announced by then and ends. ``max_steps`` is looked
at between rounds: the round that reaches it is trained whole and gets its version, and no round starts after it.
Samples are deduplicated by ``sample_id`` within a round.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from orchard.bus import Consumer, TopicPartition
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.codec import Codec
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from trainers.checkpoint import TrainerState
from trainers.exceptions import TrainerError
from trainers.intake import SampleIntake
from trainers.sample_source import Queued, SampleSource, Step
from trainers.stage_input import _item_key, read_to_end, unique_sorted
from trainers.staleness import LagStats

log = get_logger("trainers.round_input")


class RoundSource(SampleSource):
    """Steps from lockstep rollout rounds (module docstring)."""

    schedules_outputs = False  # one version and one checkpoint per round, not every N steps

    @property
    def multi_pass(self) -> bool:
        """Never: ``epochs`` are passes over one round, which a checkpoint (at a round's end) never falls inside."""
        return False

    round_trained: int | None = None
    """The newest round trained (from the checkpoint; None before the first)."""
    _round_ends: dict[TopicPartition, int]
    """Where the samples of the round being trained end."""

    def steps(self, consumer: Consumer, router: DeadLetterRouter, intake: SampleIntake) -> Iterator[Step]:
        """For each announced round not trained yet: its steps, then its ``round_end`` marker."""
        topic = self.config.rounds_topic
        self.bus.create_topic(topic, partitions=1, exist_ok=True)
        announcements = self.bus.consumer([topic], group=None, start="earliest")
        codec = Codec.default()
        pending: dict[int, dict[TopicPartition, int] | None] = {}
        try:
            while not self.done():
                pending |= self._announced(announcements, codec, intake.run_id)
                pending = {r: e for r, e in pending.items() if self.round_trained is None or r > self.round_trained}
                if not pending:
                    if self._drain_requested.is_set():
                        log.info("drained on request, exiting", step=self.trainer_step(), round=self.round_trained)
                        return
                    continue
                round_index = min(pending)
                ends = self._read_round(consumer, router, intake, round_index, pending.pop(round_index))
                if self.config.loss.behaviour_logprobs == "trainer" and self._queue:
                    samples = [queued.sample for queued in self._queue if queued.sample is not None]
                    yield Step(consumed=[], samples=samples, lags=LagStats(), relabel=True)
                round_queue = list(self._queue)  # after the relabel: every pass trains the same samples
                for epoch in range(self.config.epochs):
                    if epoch:
                        self._queue = deque(round_queue)
                    # whole, max_steps or not
                    while self._queue and (step := self._form_step(full_only=False)) is not None:
                        yield step
                self._round_ends = ends
                yield Step(consumed=[], samples=[], lags=LagStats(), round_end=round_index)
        finally:
            announcements.close()

    def settle(self, step: Step, consumer: Consumer) -> None:
        """At a round's end: its end offsets count as trained, and the round as the newest trained."""
        if step.round_end is None:
            return
        for tp, end in self._round_ends.items():
            mine = self.consumed.setdefault(tp.topic, {})
            mine[tp.partition] = max(mine.get(tp.partition, 0), end)
        self.round_trained = step.round_end

    def relabel(self, behaviour: dict[str, np.ndarray]) -> None:
        """Replace the queued samples' behaviour logprobs with the trainer's own (by sample id)."""
        self._queue = deque(
            Queued(q.tp, q.offset, replace(q.sample, behaviour_logprobs=behaviour[q.sample.sample_id]))
            if q.sample is not None and q.sample.sample_id in behaviour else q
            for q in self._queue
        )  # fmt: skip

    def resume(self, state: TrainerState, consumer: Consumer) -> None:
        """The checkpoint's offsets, and its newest round trained."""
        super().resume(state, consumer)
        self.round_trained = state.round

    def record_position(self, state: TrainerState) -> None:
        """The newest round trained goes into every checkpoint (the next stage's trainer continues after it)."""
        state.round = self.round_trained

    def _announced(
        self, announcements: Consumer, codec: Codec, run_id: str
    ) -> dict[int, dict[TopicPartition, int] | None]:
        """Rounds of this run announced complete since the last look, with where their samples end (None: the
        announcement says nothing, the topic's ends then count); waits up to ``poll_timeout_s`` for one."""
        rounds: dict[int, dict[TopicPartition, int] | None] = {}
        for record in announcements.poll(max_records=256, timeout_s=self.config.poll_timeout_s):
            try:
                decoded = codec.decode(record.value)
            except SerializationError as exc:
                log.warning("undecodable round announcement skipped", offset=record.offset, error=str(exc))
                continue
            fields = decoded.record
            if decoded.name != "RolloutRound" or fields["run_id"] != run_id or not fields.get("complete", True):
                continue
            if fields.get("samples_end_offsets") and fields.get("samples_topic") != self.config.topic:
                raise TrainerError(
                    f"round {fields['round']}'s samples are on {fields['samples_topic']!r}, this trainer reads "
                    f"{self.config.topic!r}: give the rollout and the trainer the same samples topic"
                )
            ends = fields.get("samples_end_offsets") or []
            topic = self.config.topic
            rounds[int(fields["round"])] = {TopicPartition(topic, p): end for p, end in enumerate(ends)} or None
        return rounds

    def _read_round(
        self,
        consumer: Consumer,
        router: DeadLetterRouter,
        intake: SampleIntake,
        round_index: int,
        announced_ends: dict[TopicPartition, int] | None,
    ) -> dict[TopicPartition, int]:
        """Queue the round's samples in key order: every record from the last round's end up to this one's."""
        topic = self.config.topic
        info = self.bus.describe_topic(topic)
        ends = announced_ends or {TopicPartition(topic, p): end for p, end in info.end_offsets.items()}
        starts = {tp: self.consumed.get(topic, {}).get(tp.partition, info.start_offsets.get(tp.partition, 0))
                  for tp in ends}  # fmt: skip
        for tp, start in starts.items():
            consumer.seek(tp, start)
        items = []
        for record in read_to_end(consumer, ends, self.config.poll_timeout_s):
            if record.offset < starts.get(record.topic_partition, 0):
                continue  # a rejoin rewound the consumer to the group's committed offsets: trained already
            sample = self._take(record, router, intake)
            if sample is not None:
                items.append(Queued(record.topic_partition, record.offset, sample))
        kept = unique_sorted(items, _item_key, lambda item: item.sample.sample_id if item.sample else "")
        self._queue = deque(kept)
        log.info("round samples read", round=round_index, samples=len(kept), duplicates=len(items) - len(kept),
                 ends={tp.partition: end for tp, end in ends.items()})  # fmt: skip
        return ends
