"""``PolicyTrainer``: consume ``TrainingSample`` records, train the policy, publish versions, checkpoint with offsets.

``PolicyTrainer.run`` is the training loop; its docstring lists where it departs from the textbook one. The trainer
holds the model, the loop and the run's counters; its parts live in their own modules:

- the samples, step by step (``trainers.sample_source``: a stream, with its passes and drain; ``trainers.stage_input``:
  a complete input), each record decoded and checked by ``trainers.intake``, judged stale by ``trainers.staleness``;
- packing a step's samples into rows (``trainers.batching``), the losses (``trainers.losses``), the model, optimizer
  and schedule behind a backend (``trainers.backends``: the interface, the torch and deepspeed backends, the
  factory), the starting weights and device (``trainers.model``);
- publishing a version (``trainers.weights``), checkpoints in the store (``trainers.checkpoint``), metrics
  (``trainers.metrics``).

On start (``_restore``) the trainer loads the newest checkpoint from the store (model, optimizer, scheduler, RNG,
step, version) and seeks the consumer to the offsets it was trained up to; without one, it starts from the seeded
initial weights and the group's committed offsets (or the beginning of the topic). A checkpoint another trainer wrote
(a recipe's earlier stage) gives this one its weights, step, version and offsets; with ``stage_optimizer: fresh`` its
AdamW moments and schedule start anew (moments of converged SFT are tiny, so RL steps on them would be many times
``lr``). The KL reference (``loss.kl_coef``) is the weights the stage started from, kept in the stage's own
checkpoints.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from orchard.bus import Bus, Consumer, Producer, open_bus
from orchard.bus.dead_letter import DeadLetterRouter
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from orchard.store import ArtifactStore, open_store
from orchard.topics import DEAD_LETTERS, POLICY_VERSIONS, TOPICS_BY_NAME
from trainers.backends.base import TrainingBackend
from trainers.backends.factory import open_backend
from trainers.batching import PackedBatch, Sample, pack_step
from trainers.checkpoint import CheckpointStore, Offsets, TrainerState, capture_rng, restore_rng
from trainers.config import PolicyTrainerConfig
from trainers.intake import SampleIntake
from trainers.losses import LossOutput, packed_loss, token_logprobs
from trainers.metrics import TrainerMetrics, step_values
from trainers.model import load_policy_model, load_policy_tokenizer, resolve_device
from trainers.round_input import RoundSource
from trainers.sample_source import SampleSource, Step, StreamSource
from trainers.stage_input import CompleteSource
from trainers.weights import WeightPublisher

log = get_logger("trainers.policy")

_Step = Step  # the name tests (and subclasses that record steps) import from here


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
        source = {"complete": CompleteSource, "rounds": RoundSource}.get(config.input, StreamSource)
        self.source: SampleSource = source(
            config, self.bus, trainer_step=lambda: self.step, trainer_version=lambda: self.policy_version
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
        self.summary = RunSummary(policy_version=self.policy_version)
        self._last_published_step = 0
        self._last_checkpoint_step = 0
        self._last_step_end = time.perf_counter()
        self.backend: TrainingBackend
        self.publisher: WeightPublisher
        self.reference: torch.nn.Module | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None

    # ------------------------------------------------------------------------------------------------ the loop

    def run(self) -> RunSummary:
        """Train until ``max_steps``, the last pass, a drain, or (on a stream, ``idle_exit_s``) an idle input.

        The textbook loop: for each batch, forward, loss, backward and an optimizer step; now and then save the
        weights. Where this one departs from it, and why:

        - **Batches come off the bus.** A step is the samples up to ``batch_tokens * grad_accum`` tokens, in arrival
          order on a stream (a partial step once it is idle ``idle_flush_s``, at the end of a replayed pass and on a
          drain), or, on a complete input, in each pass's order over the stage's samples read first: results that do
          not depend on the clock (``trainers.sample_source``, ``trainers.stage_input``).
        - **Not every record is trained.** Undecodable or inconsistent records go to the dead-letter topic; another
          run's, another kind's (``loss.kind``), ones too long or outside the vocabulary are skipped, and with
          ``loss.skip_zero_advantage`` (and no KL term) so are RL samples whose advantages are all zero: they carry no
          gradient (``trainers.intake``). A sample delivered twice on a complete input trains once.
        - **Staleness.** Each sample's lag behind the trainer's policy version is judged when it enters a step; past
          ``max_policy_lag`` it is dropped or down-weighted (``trainers.staleness``). A step left with no sample trains
          nothing, publishes nothing, but its records count as consumed.
        - **Micro-batches.** A step's samples are sorted by key (their arrival order within the step changes
          nothing) and packed into rows of ``batch_tokens`` (or ``row_tokens``) with positions restarting per
          sample, or with ``layout: padded`` padded into batches of one sample per row; either way no attention
          across samples (``trainers.batching``).
        - **The loss.** Per sample SFT (credit-weighted NLL) or RL (PPO-clipped against the behaviour logprobs, an
          optional KL to the stage's starting weights), normalised per token over the whole step, so accumulating
          over its rows gives the full-step gradient (``trainers.losses``).
        - **Publishing.** Every ``publish_every`` steps the weights go to the store and a ``PolicyVersion`` to the
          bus: the engines' next version and the one staleness is judged against (``trainers.weights``). With
          ``publish_on_idle``, also once a stream's input runs dry with steps unpublished: rollouts that wait for a
          newer policy (``new_policy_wait_s``) would otherwise wait for samples only they can make.
        - **Exactly once.** A checkpoint holds the offsets after the records trained (and the pass); dead letters are
          flushed before it, the group's offsets committed only when they equal it, and a restart seeks there, so
          nothing is trained twice or skipped (``trainers.checkpoint``).
        - **Passes and stages.** ``epochs`` replays the stage's records; a stage that is over checkpoints "between
          stages", where the next stage's trainer starts (``_restore``).
        - **Fencing.** A consumer that fenced itself (its group's coordinator lost) rejoins; one fenced by another
          process with its instance id raises (``orchard.bus.base.poll_through_self_fence``).
        - **The end.** With ``publish_on_exit`` a run that ends publishes and checkpoints once more (``_finish``).
        """
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
            for step in self.source.steps(consumer, router, self.intake):  # a batch of samples
                if step.idle:  # the input ran dry: rollouts waiting for a newer policy get one now
                    if self.step > self._last_published_step:
                        self._publish(producer)
                    continue
                if step.relabel:  # a lockstep round's samples: the ratio's old logprobs become the trainer's own
                    self.source.relabel(self._own_logprobs(step.samples))
                    continue
                if step.round_end is not None:  # a lockstep round trained: its version, even if nothing changed
                    self.source.settle(step, consumer)
                    self._publish(producer, {"rollout_round": float(step.round_end)})
                    self._checkpoint(consumer, router)
                    continue
                if step.samples:  # none: every record of the step was skipped or too stale
                    self._train(step)  # pack; forward, loss and backward per row; an optimizer step
                self.source.settle(step, consumer)  # its records are trained; a pass or the stage may end here
                scheduled = step.samples and self.source.schedules_outputs
                if scheduled and self.step % self.config.publish_every == 0:
                    self._publish(producer)
                if scheduled and self.step % self.config.checkpoint_every == 0:
                    self._checkpoint(consumer, router)
            self._finish(consumer, producer, router)
        finally:
            consumer.close()
            producer.close()
            self.close()
        self.summary.epochs = self.source.passes_done
        return self.summary

    def request_drain(self) -> None:
        """Train what is on the topic now, publish and checkpoint, then return from ``run`` (``orchard train policy``
        does this on SIGTERM, so a recipe's stage that stops its trainer loses no step and no sample). Thread-safe."""
        self.source.request_drain()

    @property
    def consumed(self) -> Offsets:
        """The offsets trained up to, per topic and partition."""
        return self.source.consumed

    def _finish(self, consumer: Consumer, producer: Producer, router: DeadLetterRouter) -> None:
        if not self.config.publish_on_exit:
            return
        if self.step > self._last_published_step:
            self._publish(producer)
        if self.step > self._last_checkpoint_step:
            self._checkpoint(consumer, router)

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
        self.backend = open_backend(model, self.config, self.device)
        self.publisher = WeightPublisher(self.store, self.backend.export, self.tokenizer,
                                         scratch=self.config.run_dir / "scratch", run_id=self.run_id,
                                         model=self.config.model_name, codec=self.codec)  # fmt: skip

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
        self.step, self.policy_version = state.step, state.policy_version
        self.source.resume(state, consumer)  # its offsets (the consumer sought there), pass and stage
        self._last_published_step = self._last_checkpoint_step = state.step
        self.summary = RunSummary(
            steps=state.step,
            policy_version=state.policy_version,
            samples=int(state.counters.get("samples", 0)),
            tokens=int(state.counters.get("tokens", 0)),
            resumed_from_step=state.step,
            offsets=state.offsets,
        )
        log.info("resumed", step=self.step, policy_version=self.policy_version, offsets=self.consumed,
                 epoch=self.source.epoch, optimizer="fresh" if fresh else "restored",
                 written_by=state.trainer)  # fmt: skip

    # ------------------------------------------------------------------------------------------------ training

    def _train(self, step: Step) -> None:
        """One optimizer step on ``step.samples``: pack them into rows; forward, loss and backward per row; step."""
        start = time.perf_counter()
        batches = pack_step(step.samples, self.config.packed_row_tokens, self.pad_token_id, self.config.pad_to_multiple,
                            layout=self.config.layout)  # fmt: skip
        normalizer = float(max(1, sum(s.num_loss_tokens for s in step.samples)))  # per token over the whole step
        outputs = [self._micro_batch(batch.to(self.device), normalizer) for batch in batches]
        grad_norm = self.backend.step()
        self.step += 1
        seconds = time.perf_counter() - start
        self._last_step_end = time.perf_counter()
        self._record(step, batches, outputs, grad_norm, seconds)

    def _own_logprobs(self, samples: list[Sample]) -> dict[str, np.ndarray]:
        """Each sample's logprobs under the weights held now, one forward per sample, 0 where its loss mask is 0 (as
        a sample's behaviour logprobs are): per token ``j``, ``log p(token_j | tokens before j)``."""
        own = {}
        with torch.no_grad():
            for sample in samples:
                tokens = torch.from_numpy(sample.token_ids.astype(np.int64)).to(self.device).unsqueeze(0)
                positions = torch.arange(tokens.shape[1], device=self.device).unsqueeze(0)
                logprobs = token_logprobs(self.backend.forward(tokens[:, :-1], positions[:, :-1]), tokens[:, 1:])
                values = np.zeros(sample.num_tokens, dtype=np.float32)
                values[1:] = logprobs[0].float().cpu().numpy()
                own[sample.sample_id] = values * sample.loss_mask.astype(np.float32)
        return own

    def _micro_batch(self, batch: PackedBatch, normalizer: float) -> LossOutput:
        """Forward one micro-batch, its loss (with the KL to the reference, if any), and backward."""
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
        self, step: Step, batches: list[PackedBatch], outputs: list[LossOutput], grad_norm: float, seconds: float
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

    def _publish(self, producer: Producer, extra: dict[str, float] | None = None) -> None:
        version = self.policy_version + 1
        start = time.perf_counter()
        self.publisher.publish(
            producer, version=version, step=self.step,
            metrics={**{k: float(v) for k, v in self._step_metrics().items()}, **(extra or {})},
        )  # fmt: skip
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
        state = TrainerState(self.step, self.policy_version, self.source.offsets(), counters, python_rng, numpy_rng)
        state.trainer = self.trainer_id
        self.source.record_position(state)
        tensors = {**self.backend.state_tensors(), **rng_tensors}
        if self.reference is not None:  # a trainer restarted mid-stage keeps its stage's reference
            tensors["reference"] = self.reference.state_dict()
        if self.checkpoints.save(tensors, state, advance=self.config.input == "rounds"):
            self.metrics.count("checkpoints")
        self._last_checkpoint_step = self.step
        self.summary.offsets = self.source.offsets()
        self.source.commit_if_settled(consumer)

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
