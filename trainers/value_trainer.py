"""The value trainer (``orchard train value``): finished trajectories from the bus in, value-model versions out.

Loop: poll ``trajectories`` (≤1 s), decode each record (undecodable ones and other schemas go to the dead-letter
topic), keep the complete trajectories with at least one model call, and once ``batch_size`` of them are buffered
take one BCE step (``trainers.value.bce_step``). Every ``publish_every`` steps the weights are published like the
policy's (``trainers.weights.publish_policy_version``: files and a manifest with sha256 to the store, then a
``PolicyVersion`` record with ``model=<name>``, default ``"value"``, so engines that follow the policy ignore it);
every ``checkpoint_every`` steps a checkpoint goes to the store (``trainers.checkpoint``).

With ``input: complete`` (``orchard train value --input complete``) the trainer does not follow the stream: it takes
the topic's end offsets when it starts (a stage whose trajectories are all on the bus), reads every record up to them
however they arrive, sorts the examples by (task id, episode id) and makes one pass over them, ``batch_size`` per step
(the last step partial, ``max_steps`` a cap), then publishes, checkpoints and returns. Which trajectories it trains
on, their order and its steps depend on the trajectories alone; no idle time decides the end. Its checkpoints keep
the pass's start and end offsets and how many examples of the sorted pass were trained (``pass_position``), so a
restart mid-pass reads the same trajectories and goes on from the same example.

Offsets live in the checkpoint, as the policy trainer's do: per partition, the next offset after the last record
that went into an optimizer step (skipped records count as trained once a later step passes them). A restarted
trainer seeks to them, so nothing is trained twice and nothing skipped; the consumer group's own committed offsets
are not used. A version published after the last checkpoint is not published again under the same number: a
restarted trainer continues after the newest version in the store.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from orchard.artifacts import policy_artifact_name
from orchard.bus import Bus, Consumer, Producer, Record
from orchard.bus.base import TopicPartition, poll_through_self_fence
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.episode_groups import is_eval_group
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.store import ArtifactStore
from orchard.topics import DEAD_LETTERS, POLICY_VERSIONS, TOPICS_BY_NAME, TRAJECTORIES
from orchard.trajectory import Trajectory
from orchard.trajectory_records import trajectory_from_record
from trainers.checkpoint import CheckpointStore, Offsets, TrainerState, capture_rng, restore_rng
from trainers.exceptions import CheckpointError, TrainerError
from trainers.stage_input import read_to_end
from trainers.value import ValueExample, ValueModel, ValueModelConfig, bce_step, trajectory_label, trajectory_tokens
from trainers.weights import publish_policy_version

log = get_logger("trainers.value_trainer")


class ValueTrainerConfig(BaseModel):
    """Settings of the value trainer."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field("default", min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Run to train for.")
    name: str = Field("value", pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Model name of published versions.")
    value_model: ValueModelConfig = Field(default_factory=ValueModelConfig)
    topic: str = Field(TRAJECTORIES, min_length=1, description="Topic of Trajectory records.")
    group: str | None = Field(
        None, min_length=1, description="Consumer group (default: <run_id>.value-trainer.<name>, one per run and model)"
    )
    label: Literal["success", "reward"] = Field("success", description="Target: success, or reward clipped to [0,1].")
    batch_size: int = Field(16, ge=1, description="Trajectories per optimizer step.")
    learning_rate: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping (0: off).")
    publish_every: int = Field(100, ge=1, description="Publish a version every this many steps.")
    checkpoint_every: int = Field(100, ge=1, description="Checkpoint every this many steps.")
    keep_checkpoints: int = Field(2, ge=1)
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps (None: run until stopped).")
    poll_timeout_s: float = Field(1.0, gt=0, le=1.0, description="Longest wait of one poll (≤1 s: Ctrl-C works).")
    input: Literal["stream", "complete"] = Field(
        "stream",
        description="stream: train on trajectories as they arrive; complete: every trajectory on the topic when it "
        "starts, sorted by (task, episode), one pass, then publish and exit (module docstring).",
    )

    def consumer_group(self) -> str:
        """``group``, else one per run and model name."""
        return self.group or f"{self.run_id}.value-trainer.{self.name}"


@dataclass
class _Pending:
    topic: str
    partition: int
    offset: int
    example: ValueExample | None  # None: a record that is skipped (it still moves the offsets on)


class ValueTrainer:
    """The trainer's state: model, optimizer, step, latest version, buffered examples and offsets trained up to."""

    def __init__(self, config: ValueTrainerConfig, model: ValueModel | None = None) -> None:
        self.config = config
        self.model = model or ValueModel.build(config.value_model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.step = 0
        self.version = 0
        self.skipped = 0
        self.last_loss: float | None = None
        self.offsets: Offsets = {}
        self.input_end: Offsets | None = None  # input: complete: where the pass's trajectories end (None: not begun)
        self.pass_position = 0  # input: complete: examples of the sorted pass trained
        self._pending: deque[_Pending] = deque()
        self._buffered = 0

    @property
    def artifact_name(self) -> str:
        """Where this trainer's versions live in the store."""
        return policy_artifact_name(self.config.run_id, self.config.name)

    def add(self, trajectory: Trajectory | None, *, topic: str = "", partition: int = 0, offset: int = -1) -> bool:
        """Buffer one trajectory (read at ``topic``/``partition``/``offset``); False if it is skipped.

        Skipped: None (undecodable), incomplete, another run's, a held-out evaluation episode, or without model calls.
        """
        example = self._example(trajectory)
        self._pending.append(_Pending(topic, partition, offset, example))
        if example is None:
            self.skipped += 1
            return False
        self._buffered += 1
        return True

    def _example(self, trajectory: Trajectory | None) -> ValueExample | None:
        if trajectory is None or not trajectory.complete or not trajectory.steps:
            return None
        if trajectory.run_id != self.config.run_id or is_eval_group(trajectory.group_id):
            return None
        tokens = trajectory_tokens(trajectory, self.model.max_length)
        return ValueExample(tokens, trajectory_label(trajectory, self.config.label))

    def ready(self) -> bool:
        """Whether a full batch is buffered."""
        return self._buffered >= self.config.batch_size

    def train_step(self) -> float:
        """One optimizer step on the next ``batch_size`` buffered examples; returns the loss."""
        if not self.ready():
            raise ValueError(f"only {self._buffered} of {self.config.batch_size} examples are buffered")
        batch: list[ValueExample] = []
        while len(batch) < self.config.batch_size:
            entry = self._pending.popleft()
            self._advance(entry)
            if entry.example is not None:
                batch.append(entry.example)
        self._buffered -= len(batch)
        return self.train_batch(batch)

    def train_batch(self, batch: list[ValueExample]) -> float:
        """One optimizer step on ``batch``; returns the loss."""
        self.last_loss = bce_step(self.model, self.optimizer, batch, self.config.max_grad_norm)
        self.step += 1
        log.debug("value step", step=self.step, loss=round(self.last_loss, 5))
        return self.last_loss

    def example(self, trajectory: Trajectory | None) -> ValueExample | None:
        """The example ``trajectory`` gives (None: skipped, counted), for a complete input."""
        example = self._example(trajectory)
        self.skipped += example is None
        return example

    def _advance(self, entry: _Pending) -> None:
        if entry.offset >= 0:
            parts = self.offsets.setdefault(entry.topic, {})
            parts[entry.partition] = max(parts.get(entry.partition, 0), entry.offset + 1)

    def publish(self, store: ArtifactStore, producer: Producer, scratch_dir: Path) -> dict[str, Any]:
        """Publish the current weights as the next version; return the ``PolicyVersion`` record sent."""
        scratch_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="value-version-", dir=scratch_dir))
        try:
            files = self.model.save(work)
            metrics = {"loss": self.last_loss} if self.last_loss is not None else {}
            _, record = publish_policy_version(
                store,
                producer,
                run_id=self.config.run_id,
                model=self.config.name,
                version=self.version + 1,
                files=files,
                trainer_step=self.step,
                metrics=metrics,
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self.version += 1
        log.info("value model published", version=self.version, step=self.step, loss=self.last_loss)
        return record

    def checkpoint(self, checkpoints: CheckpointStore) -> bool:
        """Save model, optimizer, RNG, step, version and offsets; False if this step was already saved."""
        tensors, python_rng, numpy_rng = capture_rng()
        tensors.update(model=self.model.state_dict(), optimizer=self.optimizer.state_dict())
        counters = {"skipped": float(self.skipped)}
        state = TrainerState(self.step, self.version, self.offsets, counters, python_rng, numpy_rng)
        state.epoch_end, state.pass_position = self.input_end, self.pass_position
        return checkpoints.save(tensors, state)

    def restore(self, checkpoints: CheckpointStore, store: ArtifactStore) -> Offsets:
        """Load the newest checkpoint (if any); return the offsets to seek to. Versions continue after the store's."""
        loaded = checkpoints.load_latest()
        if loaded is not None:
            try:
                self.model.load_state_dict(loaded.tensors["model"], strict=True)
                self.optimizer.load_state_dict(loaded.tensors["optimizer"])
            except (KeyError, RuntimeError, ValueError) as exc:
                raise CheckpointError(f"checkpoint {checkpoints.name} does not fit this value model: {exc}") from exc
            restore_rng(loaded.tensors, loaded.state.python_rng, loaded.state.numpy_rng)
            self.step = loaded.state.step
            self.version = loaded.state.policy_version
            self.offsets = {topic: dict(parts) for topic, parts in loaded.state.offsets.items()}
            self.skipped = int(loaded.state.counters.get("skipped", 0))
            self.input_end, self.pass_position = loaded.state.epoch_end, loaded.state.pass_position
        self.version = max(self.version, store.latest_version(self.artifact_name) or 0)
        return self.offsets


POLICY_BACKBONE = "policy:"
"""``value_model.model: policy:NAME``: the backbone is the run's newest published version of policy ``NAME``."""


def initial_value_model(config: ValueTrainerConfig, store: ArtifactStore, scratch_dir: Path) -> ValueModel:
    """The value model a trainer starts from: ``value_model.model`` as given, or, for ``policy:NAME``, the newest
    version of the run's policy ``NAME`` in the store as the backbone (its LM head dropped, a fresh value head): a
    value model that starts from what the policy learned about the task reads trajectories far sooner than one from
    random weights. A restarted trainer then loads its own checkpoint over it."""
    source = config.value_model.model
    if not source.startswith(POLICY_BACKBONE):
        return ValueModel.build(config.value_model)
    name = source.removeprefix(POLICY_BACKBONE)
    artifact = policy_artifact_name(config.run_id, name)
    version = store.latest_version(artifact)
    if version is None:
        raise TrainerError(
            f"value model {source!r}: run {config.run_id!r} has published no version of policy {name!r} "
            f"({artifact} is empty in the store); train the policy first or give a tiny-family name or a directory"
        )
    backbone = scratch_dir / f"backbone-{name}-v{version}"
    shutil.rmtree(backbone, ignore_errors=True)
    store.download_version(artifact, version, backbone, verify=True)
    log.info("value model backbone from the policy", policy=name, version=version)
    return ValueModel.build(config.value_model.model_copy(update={"model": str(backbone)}))


def run_value_trainer(
    bus: Bus,
    store: ArtifactStore,
    config: ValueTrainerConfig,
    *,
    scratch_dir: Path,
    stop: threading.Event | None = None,
    max_idle_polls: int | None = None,
    trainer: ValueTrainer | None = None,
) -> ValueTrainer:
    """Run the loop (module docstring) until ``max_steps``, ``stop`` is set, or ``max_idle_polls`` empty polls."""
    trainer = trainer or ValueTrainer(config, initial_value_model(config, store, scratch_dir))
    checkpoints = CheckpointStore(
        store, config.run_id, config.name, scratch_dir / "checkpoints", config.keep_checkpoints
    )
    offsets = trainer.restore(checkpoints, store)
    _ensure_topics(bus, config.topic)
    group = config.consumer_group()
    consumer = bus.consumer([config.topic], group=group)
    producer = bus.producer()
    router = DeadLetterRouter(producer, consumer_group=group)
    log.info("value trainer started", run_id=config.run_id, step=trainer.step, version=trainer.version, offsets=offsets)
    try:
        for partition, offset in offsets.get(config.topic, {}).items():
            consumer.seek(TopicPartition(config.topic, partition), offset)
        if config.input == "complete":
            _train_complete(bus, consumer, router, trainer, config, store, producer, checkpoints, scratch_dir, stop)
            return trainer
        idle = 0
        while not _finished(trainer, config, stop):
            records = poll_through_self_fence(
                consumer, max_records=config.batch_size * 4, timeout_s=config.poll_timeout_s
            )
            # A poll before the group has assigned partitions (a Kafka rebalance takes seconds) is not idleness.
            idle = 0 if records or not consumer.assignment() else idle + 1
            if max_idle_polls is not None and idle >= max_idle_polls:
                _publish_on_idle_exit(trainer, config, store, producer, checkpoints, scratch_dir)
                break
            for record in records:
                trainer.add(
                    _decode(router, record), topic=record.topic, partition=record.partition, offset=record.offset
                )
            while trainer.ready() and not _finished(trainer, config, stop):
                _step(trainer, config, store, producer, checkpoints, scratch_dir)
    finally:
        consumer.close()
        producer.close()
    log.info("value trainer stopped", step=trainer.step, version=trainer.version, skipped=trainer.skipped)
    return trainer


def _train_complete(
    bus: Bus,
    consumer: Consumer,
    router: DeadLetterRouter,
    trainer: ValueTrainer,
    config: ValueTrainerConfig,
    store: ArtifactStore,
    producer: Producer,
    checkpoints: CheckpointStore,
    scratch_dir: Path,
    stop: threading.Event | None,
) -> None:
    """``input: complete``: read up to the pass's end, sort, train the rest of the pass, publish, checkpoint."""
    topic = config.topic
    info = bus.describe_topic(topic)
    resumed, skipped = trainer.input_end is not None, trainer.skipped  # a resumed pass counted and lettered its skips
    if trainer.input_end is None:
        trainer.input_end = {topic: dict(info.end_offsets)}
    start = trainer.offsets.get(topic, {})
    ends = {TopicPartition(topic, p): end for p, end in trainer.input_end.get(topic, {}).items()}
    for tp in ends:
        consumer.seek(tp, start.get(tp.partition, info.start_offsets.get(tp.partition, 0)))
    keyed = []
    for record in read_to_end(consumer, ends, config.poll_timeout_s):
        trajectory = _decode_quietly(record, router) if resumed else _decode(router, record)
        example = trainer.example(trajectory)
        if trajectory is not None and example is not None:
            keyed.append(((trajectory.task_id, trajectory.episode_id), example))
    trainer.skipped = skipped if resumed else trainer.skipped
    examples = [example for _, example in sorted(keyed, key=lambda item: item[0])]
    log.info("value trainer input read", examples=len(examples), skipped=trainer.skipped, trained=trainer.pass_position,
             ends={tp.partition: end for tp, end in ends.items()})  # fmt: skip
    while trainer.pass_position < len(examples) and not _finished(trainer, config, stop):
        batch = examples[trainer.pass_position : trainer.pass_position + config.batch_size]
        trainer.train_batch(batch)
        trainer.pass_position += len(batch)
        if trainer.step % config.publish_every == 0:
            trainer.publish(store, producer, scratch_dir)
        if trainer.step % config.checkpoint_every == 0:
            producer.flush()
            trainer.checkpoint(checkpoints)
    if stop is not None and stop.is_set():
        return
    # the pass is over (or max_steps): offsets at its end, so a restart trains nothing twice
    trainer.offsets = {topic: {tp.partition: end for tp, end in ends.items()}}
    trainer.input_end, trainer.pass_position = None, 0
    if trainer.step and trainer.step % config.publish_every:
        trainer.publish(store, producer, scratch_dir)
    producer.flush()
    trainer.checkpoint(checkpoints)


def _publish_on_idle_exit(
    trainer: ValueTrainer,
    config: ValueTrainerConfig,
    store: ArtifactStore,
    producer: Producer,
    checkpoints: CheckpointStore,
    scratch_dir: Path,
) -> None:
    """The steps since the last publication, published and checkpointed: a trainer leaving when its input has
    dried up (a recipe's stage) must not take its last steps with it."""
    if trainer.step == 0 or trainer.step % config.publish_every == 0:
        return  # nothing trained, or already published (and checkpointed, when the cadences agree) at this step
    trainer.publish(store, producer, scratch_dir)
    producer.flush()
    trainer.checkpoint(checkpoints)


def _ensure_topics(bus: Bus, source: str) -> None:
    for name in (source, POLICY_VERSIONS, DEAD_LETTERS):
        spec = TOPICS_BY_NAME.get(name)
        bus.create_topic(name, spec.partitions if spec else None, spec.config if spec else None, exist_ok=True)


def _finished(trainer: ValueTrainer, config: ValueTrainerConfig, stop: threading.Event | None) -> bool:
    return (stop is not None and stop.is_set()) or (config.max_steps is not None and trainer.step >= config.max_steps)


def _step(
    trainer: ValueTrainer,
    config: ValueTrainerConfig,
    store: ArtifactStore,
    producer: Producer,
    checkpoints: CheckpointStore,
    scratch_dir: Path,
) -> None:
    trainer.train_step()
    last = config.max_steps is not None and trainer.step >= config.max_steps
    if trainer.step % config.publish_every == 0 or last:
        trainer.publish(store, producer, scratch_dir)
    if trainer.step % config.checkpoint_every == 0 or last:
        producer.flush()  # dead letters of the records this checkpoint's offsets pass over are acknowledged first
        trainer.checkpoint(checkpoints)


def _decode_quietly(record: Record, router: DeadLetterRouter) -> Trajectory | None:
    """A record read again in a resumed pass: its trajectory, or None without a second dead letter."""
    try:
        decoded = router.codec.decode(record.value)
        return trajectory_from_record(decoded.record, router.codec) if decoded.name == "Trajectory" else None
    except (KeyError, ValueError, SerializationError):
        return None


def _decode(router: DeadLetterRouter, record: Record) -> Trajectory | None:
    decoded = router.decode(record, expected_schema="Trajectory")
    if decoded is None:
        return None
    try:
        return trajectory_from_record(decoded.record, router.codec)
    except (KeyError, ValueError, SerializationError) as exc:
        router.send(record, f"cannot assemble the trajectory: {exc}", type(exc).__name__)
        return None
