"""``PolicyTrainer``: consume ``TrainingSample`` records, train the policy, publish versions, checkpoint with offsets.

The loop, top to bottom (``PolicyTrainer.run``):

1. **restore**: load the newest checkpoint from the store (model, optimizer, scheduler, RNG, step, version) and seek
   the consumer to the offsets it was trained up to; without one, start from the seeded initial weights and the
   group's committed offsets (or the beginning of the topic). A checkpoint another trainer wrote (a recipe's earlier
   stage) gives this one its weights, step, version and offsets; with ``stage_optimizer: fresh`` its AdamW moments and
   schedule start anew (moments of converged SFT are tiny, so RL steps on them would be many times ``lr``). The KL
   reference (``loss.kl_coef``) is the weights the stage started from, kept in the stage's own checkpoints;
2. **poll** (at most ``poll_timeout_s``), decode each record into a ``Sample`` (``trainers.intake``: undecodable or
   inconsistent records are dead-lettered and skipped), and queue it in arrival order;
3. **form a step**: take queued samples in order until the next one would overflow ``batch_tokens * grad_accum``;
   each sample's staleness is judged now, against the current version (dropped or down-weighted); the step's samples
   are sorted by key; a partial step is taken once the stream has been idle ``idle_flush_s``;
4. **train**: pack the step's samples into rows (``trainers.batching``), forward/backward each row with the
   step-normalised loss (``trainers.losses``), one optimizer step (clip, AdamW, schedule);
5. every ``publish_every`` steps **publish** the weights (safetensors + manifest) and a ``PolicyVersion``; every
   ``checkpoint_every`` steps **checkpoint** to the store with the offsets of the records trained so far.

Offsets: a step always takes a prefix of the queue, so the records trained are, in every partition, a prefix of what
was polled; the checkpoint stores the offset after that prefix. Bitwise reproducibility across a crash (with
``deterministic`` on CPU) also needs the records to arrive in the same order, which holds within a partition: a
multi-partition topic interleaves partitions by timing.

Epochs: with ``epochs > 1`` the first pass ends like a single-pass run (the stream idle for ``idle_exit_s``, nothing
queued); the trainer then records where it ended, seeks its consumer back to the offsets the stage started from and
trains the same records again (records past the first pass's end are left for the next stage), until ``epochs``
passes are done or ``max_steps`` is reached. A replayed pass flushes its last partial step as soon as every record of
the pass is queued. The pass, the stage's start and the first pass's end are in the checkpoint, so a restart mid-pass
resumes that pass; a stage that is over checkpoints as "between stages" (pass 0 from its end offsets), which is where
the next stage's trainer (same run and model name) starts.

A complete input (``input: complete``, ``trainers.stage_input``) replaces step 2 and every idle rule: the stage's
samples are read to their end first; each pass then queues them in its own order (key order, or a seeded shuffle of
it) and forms steps from that queue as in step 3, its last step partial. Offsets stay at the stage's start until the
stage is over; the checkpoint counts the samples of the pass trained (``pass_position``).

A version re-published after a crash (the previous process published it after its last checkpoint) already exists
in the store: the trainer keeps the stored files and announces the version again (engines ignore versions that are
not newer than the one they serve).
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from orchard.artifacts import policy_artifact_name
from orchard.bus import Bus, Consumer, Producer, Record, TopicPartition, open_bus
from orchard.bus.base import poll_through_self_fence
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from orchard.store import ArtifactStore, open_store
from orchard.store.versions import manifest_key
from orchard.topics import DEAD_LETTERS, POLICY_VERSIONS, TOPICS_BY_NAME
from trainers.backend import TorchBackend, TrainingBackend, load_policy_model, load_policy_tokenizer, resolve_device
from trainers.batching import PackedBatch, Sample, pack_step
from trainers.checkpoint import CheckpointStore, Offsets, TrainerState, capture_rng, restore_rng
from trainers.config import PolicyTrainerConfig
from trainers.intake import SampleIntake
from trainers.losses import LossOutput, packed_loss, token_logprobs
from trainers.metrics import TrainerMetrics, step_values
from trainers.stage_input import pass_order, read_to_end, stage_bounds, unique_sorted
from trainers.staleness import LagStats, StalenessCheck
from trainers.weights import announce_published_version, publish_policy_version

log = get_logger("trainers.policy")


@dataclass
class _Queued:
    """A polled record waiting for a step: its position, and its sample (None if it was skipped)."""

    tp: TopicPartition
    offset: int
    sample: Sample | None


@dataclass
class _Step:
    """The records one optimizer step consumes, the samples it trains on, and their lags."""

    consumed: list[_Queued]
    samples: list[Sample]
    lags: LagStats


@dataclass
class RunSummary:
    """What a run did (also the return value of ``PolicyTrainer.run``)."""

    steps: int = 0
    policy_version: int = 0
    samples: int = 0
    tokens: int = 0
    resumed_from_step: int | None = None
    published: list[int] = field(default_factory=list)
    offsets: Offsets = field(default_factory=dict)
    epochs: int = 0
    """Passes over the stage's samples this process completed."""


class PolicyTrainer:
    """The policy trainer; see the module docstring. ``run()`` trains until ``max_steps`` or an idle exit."""

    def __init__(
        self,
        config: PolicyTrainerConfig,
        orchard: OrchardConfig,
        *,
        bus: Bus | None = None,
        store: ArtifactStore | None = None,
        codec: Codec | None = None,
    ) -> None:
        self.config = config
        self.orchard = orchard
        self.run_id = config.run_id or orchard.run_id
        self.trainer_id = str(config.run_dir.resolve())  # a restart of this trainer has the same; the next stage not
        self.codec = codec or Codec.default()
        self._owns = (bus is None, store is None)
        self.bus = bus or open_bus(orchard.bus)
        self.store = store or open_store(orchard.store)
        self.device = resolve_device(config.device)
        self.staleness = StalenessCheck(
            config.staleness.max_policy_lag, config.staleness.policy, config.staleness.decay
        )
        self.checkpoints = CheckpointStore(
            self.store, self.run_id, config.model_name, config.run_dir / "scratch", config.keep_checkpoints
        )
        self.metrics = TrainerMetrics(
            config.run_dir, {"run_id": self.run_id, "model": config.model_name}, port=config.metrics_port
        )
        self.metrics.write_config(self._resolved_config())
        self.step = 0
        self.policy_version = config.initial_version
        self.consumed: Offsets = {}
        self.epoch = 0  # the pass over the stage's samples, from 0
        self.epoch_start: Offsets = {}  # where the stage started: each pass seeks back here
        self.epoch_end: Offsets | None = None  # where the first pass ended (known from the second pass on)
        self.pass_position = 0  # complete input: samples of the current pass trained, in its order
        self._stage_done = False
        self.summary = RunSummary(policy_version=self.policy_version)
        self._queue: deque[_Queued] = deque()
        self._last_published_step = 0
        self._last_checkpoint_step = 0
        self._last_step_end = time.perf_counter()
        self.backend: TrainingBackend
        self.reference: torch.nn.Module | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._drain_requested = threading.Event()
        self._drain_ends: dict[int, int] | None = None

    # ------------------------------------------------------------------------------------------------ the loop

    def run(self) -> RunSummary:
        """Train until ``max_steps``, the last pass over a complete input, or (``idle_exit_s``) an idle stream."""
        self._prepare_torch()
        self._build_model()
        self._create_topics()
        producer = self.bus.producer()
        group = self.config.consumer_group(self.run_id)
        instance = self.config.static_instance_id(self.run_id)
        consumer = self.bus.consumer([self.config.topic], group, instance_id=instance)
        router = DeadLetterRouter(producer, self.codec, consumer_group=group)
        try:
            self._restore(consumer)
            if self.config.input == "complete":
                self._train_complete(consumer, producer, router)
            else:
                self._loop(consumer, producer, router)
            self._finish(consumer, producer, router)
        finally:
            consumer.close()
            producer.close()
            self.close()
        return self.summary

    def _loop(self, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        last_arrival = time.monotonic()
        while not self._reached_max_steps() and not self._stage_done:
            if self._replay_complete():  # restored at the very end of a replayed pass
                self._next_epoch(consumer)
                continue
            records = poll_through_self_fence(consumer, max_records=256, timeout_s=self.config.poll_timeout_s)
            if records:
                last_arrival = time.monotonic()
                self._enqueue(records, router)
            while not self._done() and (step := self._form_step(full_only=True)) is not None:
                self._run_step(step, consumer, producer, router)
            while not self._done() and self._queue and self._replay_fully_queued():
                step = self._form_step(full_only=False)
                if step is not None:
                    self._run_step(step, consumer, producer, router)
            idle = time.monotonic() - last_arrival
            if not self._done() and not records and self._queue and idle >= self.config.idle_flush_s:
                step = self._form_step(full_only=False)
                if step is not None:
                    self._run_step(step, consumer, producer, router)
            if self._drain_requested.is_set() and self.epoch == 0 and self._drained(consumer):
                while not self._done() and self._queue and (step := self._form_step(full_only=False)) is not None:
                    self._run_step(step, consumer, producer, router)
                log.info("drained on request, exiting", step=self.step, queued=len(self._queue))
                return
            idle_exit = self.config.idle_exit_s
            if self.epoch == 0 and idle_exit is not None and not self._queue and idle >= idle_exit:
                if self.config.epochs == 1:
                    log.info("stream idle, exiting", idle_s=round(idle, 1), step=self.step)
                    return
                log.info("stream idle, first pass done", idle_s=round(idle, 1), step=self.step)
                self._next_epoch(consumer)
                last_arrival = time.monotonic()

    def request_drain(self) -> None:
        """Train what is on the topic now, publish and checkpoint, then return from ``run`` (``orchard train policy``
        does this on SIGTERM, so a recipe's stage that stops its trainer loses no step and no sample). Thread-safe."""
        self._drain_requested.set()

    def _drained(self, consumer: Consumer) -> bool:
        """Whether every record that was on the topic when the drain was asked for has been polled."""
        if self._drain_ends is None:
            self._drain_ends = dict(self.bus.describe_topic(self.config.topic).end_offsets)
        position = {tp.partition: offset for tp, offset in consumer.position().items() if tp.topic == self.config.topic}
        return all(position.get(partition, 0) >= end for partition, end in self._drain_ends.items() if end > 0)

    def _done(self) -> bool:
        return self._stage_done or self._reached_max_steps()

    def _run_step(self, step: _Step, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        if step.samples:
            self._train(step)
        self._mark_consumed(step.consumed)
        # the pass's or stage's end is settled before the checkpoint of this step, which must record it
        if self._replay_complete():
            self._next_epoch(consumer)
        if self._reached_max_steps() and self.config.epochs > 1:
            self._end_stage()
        if step.samples:
            self._publish_or_checkpoint(consumer, producer, router)

    def _publish_or_checkpoint(self, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        if self.step % self.config.publish_every == 0:
            self._publish(producer)
        if self.step % self.config.checkpoint_every == 0:
            self._checkpoint(consumer, router)

    def _finish(self, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        if not self.config.publish_on_exit:
            return
        if self.step > self._last_published_step:
            self._publish(producer)
        if self.step > self._last_checkpoint_step:
            self._checkpoint(consumer, router)

    def _reached_max_steps(self) -> bool:
        return self.config.max_steps is not None and self.step >= self.config.max_steps

    def _multi_pass(self) -> bool:
        """Whether the checkpoint carries the pass and the stage's offsets (several passes, or a complete input)."""
        return self.config.epochs > 1 or self.config.input == "complete"

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
        self.summary.epochs += 1
        if self.epoch >= self.config.epochs:
            log.info("last pass done", epochs=self.config.epochs, step=self.step)
            self._end_stage()
            return
        if self.epoch_end is None:
            self.epoch_end = _copy(self.consumed)
        self._queue.clear()  # empty at a pass's end; records past epoch_end are never queued in a replay
        for topic, parts in self.epoch_start.items():
            for partition, offset in parts.items():
                consumer.seek(TopicPartition(topic, partition), offset)
                self.consumed.setdefault(topic, {})[partition] = offset
        log.info("pass over the stage's samples", epoch=self.epoch, of=self.config.epochs, start=self.epoch_start)

    def _end_stage(self) -> None:
        """The stage is over: offsets at the first pass's end, and the state reads "pass 0 of the next stage"."""
        for topic, parts in (self.epoch_end or {}).items():
            for partition, end in parts.items():
                mine = self.consumed.setdefault(topic, {})
                mine[partition] = max(mine.get(partition, 0), end)
        self.epoch, self.epoch_start, self.epoch_end, self.pass_position = 0, _copy(self.consumed), None, 0
        self._stage_done = True

    # ------------------------------------------------------------------------------------------------ complete input

    def _train_complete(self, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        """A complete input (``trainers.stage_input``): read the stage's samples, then train its passes over them."""
        items = self._read_stage(consumer, router)
        while not self._done():
            order = pass_order(items, self.config.order, self.config.seed, self.epoch)
            self._queue = deque(order[self.pass_position :])
            if not self._queue:
                self._end_pass()
            while self._queue and not self._done() and (step := self._form_step(full_only=False)) is not None:
                if step.samples:
                    self._train(step)
                self.pass_position += len(step.consumed)
                if not self._queue:
                    self._end_pass()
                if self._reached_max_steps() and not self._stage_done:
                    self._end_stage()
                if step.samples:
                    self._publish_or_checkpoint(consumer, producer, router)

    def _end_pass(self) -> None:
        self.epoch, self.pass_position = self.epoch + 1, 0
        self.summary.epochs += 1
        log.info("pass over the stage's samples done", epoch=self.epoch, of=self.config.epochs, step=self.step)
        if self.epoch >= self.config.epochs:
            self._end_stage()

    def _read_stage(self, consumer: Consumer, router: DeadLetterRouter) -> list[_Queued]:
        """Every valid sample of the stage, once each, in key order (a restart reads them quietly: judged before)."""
        resumed = self.epoch_end is not None
        ends = self.epoch_end or self.config.input_end
        start, end = stage_bounds(self.bus, consumer, self.config.topic, self.epoch_start, ends)
        self.epoch_start, self.epoch_end = _by_topic(start), _by_topic(end)
        self.consumed = _copy(self.epoch_start)  # offsets stay at the stage's start until it is over
        items = []
        for record in read_to_end(consumer, end, self.config.poll_timeout_s):
            sample = self.intake.retake(record) if resumed else self._sample(record, router)
            if sample is not None:
                items.append(_Queued(record.topic_partition, record.offset, sample))
        kept = unique_sorted(items, _item_key, lambda item: item.sample.sample_id if item.sample else "")
        log.info("stage samples read", samples=len(kept), duplicates=len(items) - len(kept), start=self.epoch_start,
                 end=self.epoch_end, epoch=self.epoch, pass_position=self.pass_position)  # fmt: skip
        return kept

    # ------------------------------------------------------------------------------------------------ setup

    def _prepare_torch(self) -> None:
        if self.config.cpu_threads is not None:
            torch.set_num_threads(self.config.cpu_threads)
        if self.config.deterministic:  # process-wide, as torch has it
            torch.use_deterministic_algorithms(True)
        random.seed(self.config.seed)
        np.random.seed(self.config.seed)  # noqa: NPY002 - the global RNG is what user code seeds
        torch.manual_seed(self.config.seed)

    def _build_model(self) -> None:
        model = load_policy_model(self.config.model)
        self.tokenizer = load_policy_tokenizer(self.config.model)  # published with every version
        self.pad_token_id = int(model.config.pad_token_id or 0)
        context = int(getattr(model.config, "max_position_embeddings", 0) or 0)
        max_tokens = self.config.max_sample_tokens or context or None
        vocab_size = int(model.config.vocab_size)
        skip_zero = self.config.loss.skip_zero_advantage and self.config.loss.kl_coef == 0.0
        self.intake = SampleIntake(self.run_id, self.config.loss.kind, vocab_size, max_tokens, self.codec, self.metrics,
                                   skip_zero_advantage=skip_zero)  # fmt: skip
        if self.config.loss.kl_coef > 0.0:
            reference = load_policy_model(self.config.model).to(self.device).eval()
            reference.requires_grad_(False)
            self.reference = reference
        if self.config.backend == "deepspeed":
            from trainers.deepspeed_backend import DeepSpeedBackend

            self.backend = DeepSpeedBackend(model, self.config, self.device)
        else:
            self.backend = TorchBackend(model, self.config, self.device)

    def _create_topics(self) -> None:
        for topic in (self.config.topic, POLICY_VERSIONS, DEAD_LETTERS):
            spec = TOPICS_BY_NAME.get(topic)
            self.bus.create_topic(topic, spec.partitions if spec else None, exist_ok=True)

    def _restore(self, consumer: Consumer) -> None:
        checkpoint = self.checkpoints.load_latest()
        if checkpoint is None:
            log.info("no checkpoint, starting from the initial weights", run_id=self.run_id, seed=self.config.seed)
            return
        state = checkpoint.state
        fresh = self.config.stage_optimizer == "fresh" and state.trainer != self.trainer_id
        self.backend.load_state_tensors({"model": checkpoint.tensors["model"]} if fresh else checkpoint.tensors)
        if self.reference is not None:  # KL is to the weights this stage started from, not to the seed's weights
            self.reference.load_state_dict(checkpoint.tensors.get("reference", checkpoint.tensors["model"]))
        restore_rng(checkpoint.tensors, state.python_rng, state.numpy_rng)
        self.step, self.policy_version, self.consumed = state.step, state.policy_version, state.offsets
        if self._multi_pass():  # a checkpoint between stages (or older than epochs) starts a stage here
            self.epoch = state.epoch
            self.epoch_start = _copy(state.epoch_start if state.epoch_start is not None else state.offsets)
            self.epoch_end = _copy(state.epoch_end) if state.epoch_end is not None else None
            self.pass_position = state.pass_position if self.epoch_end is not None else 0
        self._last_published_step = self._last_checkpoint_step = state.step
        self.summary = RunSummary(
            steps=state.step,
            policy_version=state.policy_version,
            samples=int(state.counters.get("samples", 0)),
            tokens=int(state.counters.get("tokens", 0)),
            resumed_from_step=state.step,
            offsets=state.offsets,
        )
        for topic, partitions in state.offsets.items():
            for partition, offset in partitions.items():
                consumer.seek(TopicPartition(topic, partition), offset)
        log.info("resumed", step=self.step, policy_version=self.policy_version, offsets=self.consumed, epoch=self.epoch,
                 optimizer="fresh" if fresh else "restored", written_by=state.trainer)  # fmt: skip

    # ------------------------------------------------------------------------------------------------ input

    def _enqueue(self, records: list[Record], router: DeadLetterRouter) -> None:
        for record in records:
            tp = record.topic_partition
            if self.epoch == 0:
                self.epoch_start.setdefault(tp.topic, {}).setdefault(tp.partition, record.offset)
            elif self.epoch_end is not None and record.offset >= self.epoch_end.get(tp.topic, {}).get(tp.partition, 0):
                continue  # arrived after the first pass: the next stage's
            self._queue.append(_Queued(tp, record.offset, self._sample(record, router)))

    def _sample(self, record: Record, router: DeadLetterRouter) -> Sample | None:
        return self.intake.retake(record) if self.epoch > 0 else self.intake.take(record, router)

    def _form_step(self, *, full_only: bool) -> _Step | None:
        """The next step from the head of the queue; None if ``full_only`` and the budget is not filled yet."""
        budget, tokens, kept, lags = self.config.step_tokens, 0, [], LagStats()
        cut = len(self._queue)
        for index, queued in enumerate(self._queue):
            if queued.sample is None:
                continue
            verdict = self.staleness.judge(queued.sample.policy_version, self.policy_version)
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
        return _Step(consumed, sorted(kept, key=lambda sample: sample.key), lags)

    def _mark_consumed(self, consumed: list[_Queued]) -> None:
        for queued in consumed:
            self.consumed.setdefault(queued.tp.topic, {})[queued.tp.partition] = queued.offset + 1

    # ------------------------------------------------------------------------------------------------ training

    def _train(self, step: _Step) -> None:
        start = time.perf_counter()
        batches = pack_step(step.samples, self.config.batch_tokens, self.pad_token_id, self.config.pad_to_multiple)
        normalizer = float(max(1, sum(s.num_loss_tokens for s in step.samples)))
        outputs = [self._micro_batch(batch.to(self.device), normalizer) for batch in batches]
        grad_norm = self.backend.step()
        self.step += 1
        seconds = time.perf_counter() - start
        self._last_step_end = time.perf_counter()
        self._record(step, batches, outputs, grad_norm, seconds)

    def _micro_batch(self, batch: PackedBatch, normalizer: float) -> LossOutput:
        logits = self.backend.forward(batch.input_ids, batch.position_ids)
        logprobs = token_logprobs(logits, batch.targets)
        del logits
        reference = None
        if self.reference is not None:
            with torch.no_grad():
                ref_logits = self.reference(
                    input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
                ).logits
                reference = token_logprobs(ref_logits, batch.targets)
        output = packed_loss(
            logprobs,
            batch,
            normalizer=normalizer,
            clip_eps=self.config.loss.clip_eps,
            clip_eps_high=self.config.loss.clip_eps_high,
            kl_coef=self.config.loss.kl_coef,
            reference_logprobs=reference,
        )
        self.backend.backward(output.loss)
        return output

    def _record(
        self, step: _Step, batches: list[PackedBatch], outputs: list[LossOutput], grad_norm: float, seconds: float
    ) -> None:
        tokens = sum(s.num_tokens for s in step.samples)
        values: dict[str, Any] = {
            "step": self.step,
            "time": time.time(),
            "policy_version": self.policy_version,
            **step_values(step.samples, batches, outputs, step.lags),
            "grad_norm": grad_norm,
            "lr": self.backend.lr,
            "seconds": seconds,
            "tokens_per_second": tokens / seconds if seconds > 0 else 0.0,
        }
        for sample in step.samples:
            self.metrics.observe_lag(max(0, self.policy_version - sample.policy_version))
        self.metrics.count("samples", len(step.samples))
        self.metrics.count("tokens", tokens)
        self.metrics.count("samples_dropped_stale", step.lags.dropped)
        self.metrics.count("samples_downweighted_stale", step.lags.downweighted)
        self.metrics.record_step(values)
        self.summary.steps, self.summary.samples = self.step, self.summary.samples + len(step.samples)
        self.summary.tokens += tokens
        self._last_values = values

    # ------------------------------------------------------------------------------------------------ output

    def _publish(self, producer: Producer) -> None:
        version = self.policy_version + 1
        scratch = self.config.run_dir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"export-v{version}-", dir=scratch))
        start = time.perf_counter()
        metrics = {k: float(v) for k, v in self._step_metrics().items()}
        try:
            name = policy_artifact_name(self.run_id, self.config.model_name)
            if self.store.exists(manifest_key(name, version)):
                announce_published_version(self.store, producer, run_id=self.run_id, model=self.config.model_name,
                                           version=version, step=self.step, codec=self.codec)  # fmt: skip
            else:
                files = self.backend.export(work)
                if self.tokenizer is not None:  # AutoTokenizer loads a published version as AutoModel does
                    self.tokenizer.save_pretrained(work)
                    files = {p.name: p for p in sorted(work.iterdir()) if p.is_file()}
                publish_policy_version(
                    self.store, producer, run_id=self.run_id, model=self.config.model_name, version=version,
                    files=files, trainer_step=self.step, metrics=metrics, codec=self.codec,
                )  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.policy_version = version
        self._last_published_step = self.step
        self.summary.policy_version = version
        self.summary.published.append(version)
        self.metrics.count("versions_published")
        self.metrics.set_gauge("policy_version", version)
        log.info(
            "policy version published",
            version=version,
            step=self.step,
            seconds=round(time.perf_counter() - start, 3),
            since_step_s=round(time.perf_counter() - self._last_step_end, 3),
        )

    def _checkpoint(self, consumer: Consumer, router: DeadLetterRouter) -> None:
        router.flush()  # letters of skipped records are durable before their offsets are
        rng_tensors, python_rng, numpy_rng = capture_rng()
        counters = {"samples": float(self.summary.samples), "tokens": float(self.summary.tokens)}
        state = TrainerState(self.step, self.policy_version, _copy(self.consumed), counters, python_rng, numpy_rng)
        state.trainer = self.trainer_id
        if self._multi_pass() and not self._stage_done:
            state.epoch, state.epoch_start = self.epoch, _copy(self.epoch_start)
            state.epoch_end = _copy(self.epoch_end) if self.epoch_end is not None else None
            state.pass_position = self.pass_position
        tensors = {**self.backend.state_tensors(), **rng_tensors}
        if self.reference is not None:  # a trainer restarted mid-stage keeps its stage's reference
            tensors["reference"] = self.reference.state_dict()
        if self.checkpoints.save(tensors, state):
            self.metrics.count("checkpoints")
        self._last_checkpoint_step = self.step
        self.summary.offsets = _copy(self.consumed)
        self._commit_if_settled(consumer)

    def _commit_if_settled(self, consumer: Consumer) -> None:
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

    def _step_metrics(self) -> dict[str, float]:
        values = getattr(self, "_last_values", {})
        keys = ("loss", "grad_norm", "kl", "clip_fraction", "reward_mean", "advantage_mean", "policy_lag_mean")
        return {k: float(values[k]) for k in keys if k in values}

    def _resolved_config(self) -> dict[str, Any]:
        orchard = self.orchard.model_dump(mode="json", exclude={"store": {"access_key", "secret_key"}})
        trainer = {
            **self.config.model_dump(mode="json"),
            "group_id": self.config.consumer_group(self.run_id),
            "instance_id": self.config.static_instance_id(self.run_id),
        }
        return {"trainer": trainer, "orchard": orchard, "run_id": self.run_id}

    def close(self) -> None:
        """Close the metrics file and the bus and store this trainer opened."""
        self.metrics.close()
        if self._owns[0]:
            self.bus.close()
        if self._owns[1]:
            self.store.close()


def _copy(offsets: Offsets) -> Offsets:
    return {topic: dict(parts) for topic, parts in offsets.items()}


def _by_topic(offsets: dict[TopicPartition, int]) -> Offsets:
    grouped: Offsets = {}
    for tp, offset in offsets.items():
        grouped.setdefault(tp.topic, {})[tp.partition] = offset
    return grouped


def _item_key(item: _Queued) -> tuple[Any, ...]:
    """Key order, then the first delivery of a sample id (lowest partition and offset) first."""
    return (item.sample.key if item.sample else ("", "", ""), item.tp.partition, item.offset)
