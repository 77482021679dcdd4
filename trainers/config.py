"""``PolicyTrainerConfig``: everything the policy trainer needs besides the bus and the store (``OrchardConfig``).

Imports without torch, so the CLI can validate a config (and name the bad field) before loading a model. A file is
YAML; ``load_trainer_config`` overlays ``--set key.path=value`` overrides on it. The trainer backend is a union keyed
by ``type`` (``TrainerBackendConfig``), opened by ``trainers.backends.factory.open_backend``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from orchard.config import default_type, describe_validation_error
from orchard.exceptions import ConfigError
from orchard.topics import ROLLOUT_ROUNDS, SAMPLES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinyModelSource(_Strict):
    """A member of the built-in tiny family (``orchard.engines.tiny``), initialised from ``seed``."""

    type: Literal["tiny"] = "tiny"
    name: str = Field("tiny-llama-micro", description="Family member (orchard.engines.tiny.TINY_MODELS).")
    seed: int = Field(0, ge=0, description="Initialisation seed (the engines' --tiny-seed for the same weights).")


class CheckpointModelSource(_Strict):
    """Any Hugging Face causal-LM checkpoint directory (``config.json`` + weights)."""

    type: Literal["checkpoint"] = "checkpoint"
    path: Path = Field(..., description="Checkpoint directory to start from (also the KL reference).")


ModelSource = Annotated[TinyModelSource | CheckpointModelSource, Field(discriminator="type")]


class ScheduleConfig(_Strict):
    """Learning-rate schedule: linear warm-up, then constant, linear or cosine decay to ``min_lr_ratio * lr``."""

    kind: Literal["constant", "linear", "cosine"] = Field("constant", description="Shape after the warm-up.")
    warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear warm-up from 0.")
    total_steps: int | None = Field(
        None, ge=1, description="Length of the decay (linear/cosine); default: the trainer's max_steps."
    )
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Floor of the decay, as a fraction of lr.")


class LossConfig(_Strict):
    """Which loss each sample gets, and its coefficients."""

    kind: Literal["auto", "sft", "rl"] = Field(
        "auto",
        description="auto: each sample's own kind (SFT: weighted NLL, RL: clipped policy gradient); "
        "sft/rl: train only samples of that kind, skip (and count) the others.",
    )
    clip_eps: float = Field(0.2, gt=0.0, lt=1.0, description="PPO clip range: ratios under 1 - eps are clipped.")
    clip_eps_high: float | None = Field(
        None, gt=0.0, description="Clip range above 1 (asymmetric clipping); default: clip_eps."
    )
    kl_coef: float = Field(0.0, ge=0.0, description="Weight of the KL penalty to the frozen initial model (0: off).")
    skip_zero_advantage: bool = Field(
        False,
        description="Skip (and count) RL samples whose every advantage is zero (a group that all succeeded or all "
        "failed): with kl_coef 0 they carry no gradient, so they only dilute the step's token normalizer and cost a "
        "forward and backward pass (DAPO's dynamic sampling). Ignored when kl_coef > 0.",
    )
    behaviour_logprobs: Literal["sampled", "trainer"] = Field(
        "sampled",
        description="The 'old' logprobs of the clipped ratio. sampled: what the engine reported with each token; "
        "trainer (input: rounds only): the trainer's own, computed once per round with the weights it holds at the "
        "round's start, which are the version every sample of the round was sampled from. They do not depend on "
        "how the engine batched its requests, so the same tokens give bitwise the same update.",
    )


class StalenessConfig(_Strict):
    """Bounded staleness: how far behind the trainer's current version a sample's policy version may be."""

    max_policy_lag: int | None = Field(
        None, ge=0, description="Samples more versions behind than this are stale (None: no limit)."
    )
    policy: Literal["drop", "downweight"] = Field(
        "drop", description="drop stale samples, or scale their loss by decay ** (lag - max_policy_lag)."
    )
    decay: float = Field(0.5, gt=0.0, le=1.0, description="Per-version factor of the down-weighting.")


class TorchBackendConfig(_Strict):
    """The default trainer backend: plain torch on the CPU or one GPU (AdamW, optional ``torch.compile``)."""

    type: Literal["torch"] = "torch"


class DeepSpeedBackendConfig(_Strict):
    """ZeRO through DeepSpeed (``pip install 'orchard-rl[deepspeed]'``), one trainer process per GPU."""

    type: Literal["deepspeed"] = "deepspeed"
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="DeepSpeed config merged on top of the one the trainer's settings map to (zero_optimization, "
        "offload, ...); see trainers.backends.deepspeed_backend.",
    )


def _backend_name(value: Any) -> Any:
    """A backend's name alone is short for its config with the defaults: ``backend: deepspeed`` (the only form
    before the union, so existing files and ``--set backend=...`` keep working) is ``backend: {type: deepspeed}``.

    >>> _backend_name("deepspeed")
    {'type': 'deepspeed'}
    """
    return {"type": value} if isinstance(value, str) else value


TrainerBackendConfig = Annotated[
    TorchBackendConfig | DeepSpeedBackendConfig,
    Field(discriminator="type"),
    default_type(TorchBackendConfig, DeepSpeedBackendConfig, environment=False),  # a file and --set, no ORCHARD_*
    BeforeValidator(_backend_name),  # the last before-validator runs first: the name becomes a mapping, then typed
]


class PolicyTrainerConfig(_Strict):
    """The policy trainer: model, optimisation, batching, losses, staleness, publication, checkpoints, run."""

    model: ModelSource = Field(default_factory=TinyModelSource, description="What to train.")
    model_name: str = Field("policy", min_length=1, description="PolicyVersion.model of the published weights.")
    run_id: str | None = Field(None, description="Run the samples and versions belong to; default: Orchard's run_id.")
    topic: str = Field(SAMPLES, min_length=1, description="Topic of TrainingSample records.")
    group_id: str | None = Field(
        None,
        min_length=1,
        description="Consumer group of the trainer (default: <run id>.policy-trainer.<model_name>, so trainers of two "
        "runs or two models never share one, while a later stage of the same model continues the earlier one's).",
    )
    instance_id: str | None = Field(
        None,
        min_length=1,
        description="Static group membership (group.instance.id) of this process: a restart takes its partitions back "
        "at once (default: <group>.<rank>, rank from $RANK, else 0). Two live processes with one id fence each other; "
        "the fenced one exits with an error.",
    )
    initial_version: int = Field(0, ge=0, description="Version number of the starting weights (engines serve it).")

    lr: float = Field(1e-5, gt=0.0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    batch_tokens: int = Field(
        4096, ge=8, description="Token budget of one micro-batch (one packed row); a longer sample gets its own row."
    )
    grad_accum: int = Field(
        1, ge=1, description="Micro-batch budgets per optimizer step: a step takes batch_tokens * grad_accum tokens."
    )
    row_tokens: int | None = Field(
        None,
        ge=1,
        description="Token budget of one packed row (one forward and backward) when it should be less than "
        "batch_tokens (None: batch_tokens; 1: one sample per row). Without variable-length attention (CPU SDPA) a "
        "row's attention costs the square of its length, masked across its samples: on one core a 9-sample step of "
        "3,900 tokens took 2.0 s in one row and 0.7 s in rows of one sample. Steps and their gradient do not change.",
    )
    layout: Literal["packed", "padded"] = Field(
        "packed",
        description="How a micro-batch holds its samples (trainers/batching.py). packed: concatenated into one row, "
        "no padding, attention over the whole row unless FlashAttention takes the row as variable-length sequences. "
        "padded: one row per sample, padded to the longest, batch_tokens counting the padding; attention per sample. "
        "On the CPU a step of 32 ten-token samples took 11.3 ms padded and 13.8 ms packed; 9 samples of 430 tokens "
        "1.2 s padded, 3.9 s packed, 1.3 s in rows of one sample.",
    )
    pad_to_multiple: int = Field(
        1, ge=1, description="Pad each row to a multiple of this (steadier shapes for torch.compile)."
    )
    max_sample_tokens: int | None = Field(
        None, ge=2, description="Longer samples are skipped and counted (default: the model's context length)."
    )
    grad_clip: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm to this (None: off).")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 autocast where the device supports it (CUDA with bf16), else fp32."
    )
    compile: bool = Field(False, description="Run the model's forward through torch.compile.")
    device: str = Field("auto", description="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    backend: TrainerBackendConfig = Field(
        default_factory=TorchBackendConfig,
        description="What holds the model and optimizer: {type: torch} or {type: deepspeed, config: {...}} (ZeRO "
        "through orchard-rl[deepspeed]); the name alone (backend: deepspeed) is short for {type: NAME}.",
    )

    loss: LossConfig = Field(default_factory=LossConfig)
    staleness: StalenessConfig = Field(default_factory=StalenessConfig)

    stage_optimizer: Literal["keep", "fresh"] = Field(
        "keep",
        description="On restoring a checkpoint another trainer wrote (a recipe's earlier stage): keep its AdamW "
        "moments and schedule position, or start both fresh (weights, step, version and offsets are restored either "
        "way). A trainer restarted from its own checkpoint always restores them.",
    )
    publish_every: int = Field(10, ge=1, description="Publish weights (and a PolicyVersion) every N optimizer steps.")
    checkpoint_every: int = Field(50, ge=1, description="Checkpoint to the store every N optimizer steps.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept in the store (older ones are deleted).")
    publish_on_exit: bool = Field(True, description="Publish and checkpoint once more when the run ends.")
    publish_on_idle: bool = Field(
        False,
        description="input: stream: also publish once the input ran dry (nothing queued, nothing arrived for "
        "idle_flush_s) with steps trained since the last publish, so rollouts that wait for a newer policy "
        "(a rollout's new_policy_wait_s) get one as soon as everything they made is trained.",
    )

    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps (None: run on).")
    input: Literal["stream", "complete", "rounds"] = Field(
        "stream",
        description="stream: train samples as they arrive (an open-ended input, as in RL); complete: the stage's "
        "samples are all on the topic before it starts (their producers finished): read them up to input_end, put "
        "them in a fixed order (order), make epochs passes over them, exit. No idle time decides anything. rounds: "
        "lockstep RL: train each round a lockstep rollout announces on rounds_topic, whole and in key order, then "
        "publish one version (trainers.round_input).",
    )
    rounds_topic: str = Field(
        ROLLOUT_ROUNDS, min_length=1, description="input: rounds: the topic of the rollout's RolloutRound records."
    )
    input_end: dict[str, dict[int, int]] | None = Field(
        None,
        description="input: complete: where the stage's samples end, {topic: {partition: offset}} (default: the "
        "topic's end offsets when the stage's first trainer process starts; a restart keeps its checkpoint's).",
    )
    order: Literal["shuffle", "key"] = Field(
        "shuffle",
        description="input: complete: the order of each pass. key: sorted by (task_id, episode_id, sample_id); "
        "shuffle: a permutation of that sorted list seeded by (seed, pass).",
    )
    epochs: int = Field(
        1,
        ge=1,
        description="Passes over the stage's samples, up to this many in all: with input: complete, over the "
        "samples read; with input: stream, after the first (ended by idle_exit_s), seek back to where the stage "
        "started and train the same records again; with input: rounds, over each round's samples before its "
        "version (PPO epochs).",
    )
    idle_flush_s: float = Field(
        5.0, ge=0.0, description="Train a partial step once no sample arrived for this long (the stream is idle)."
    )
    idle_exit_s: float | None = Field(
        None, gt=0.0, description="Exit once the stream was idle this long with nothing left to train (None: never)."
    )
    poll_timeout_s: float = Field(0.5, gt=0.0, le=10.0, description="Longest wait of one poll of the topic.")

    seed: int = Field(0, ge=0, description="Seed of every RNG (python, numpy, torch).")
    deterministic: bool = Field(False, description="torch deterministic algorithms (bitwise-reproducible on CPU).")
    cpu_threads: int | None = Field(None, ge=1, description="torch intra-op threads (None: torch's default).")
    run_dir: Path = Field(Path(".orchard/runs/policy"), description="Resolved config, metrics.jsonl, scratch files.")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Serve Prometheus metrics on this port (None: off)."
    )

    @model_validator(mode="before")
    @classmethod
    def _fold_deepspeed_config(cls, data: Any) -> Any:
        """A top-level ``deepspeed_config`` (where DeepSpeed's options were before the backend union) is the deepspeed
        backend's ``config``; a torch backend ignores it, as it always did, so ``--set backend=torch`` still runs a
        file written for DeepSpeed on one device."""
        if not isinstance(data, dict) or "deepspeed_config" not in data:
            return data
        data = dict(data)
        options = data.pop("deepspeed_config")
        if not isinstance(options, dict):
            raise ValueError(f"deepspeed_config: must be a mapping of DeepSpeed settings, not {options!r}")
        backend = _backend_name(data.get("backend"))
        if isinstance(backend, DeepSpeedBackendConfig):  # built in Python rather than read from a file
            backend = backend.model_dump(exclude_unset=True) | {"type": "deepspeed"}
        if isinstance(backend, dict) and backend.get("type") == "deepspeed":
            if "config" in backend:
                raise ValueError("deepspeed_config: DeepSpeed's options are given twice; keep backend.config only")
            data["backend"] = {**backend, "config": options}
        return data

    @model_validator(mode="after")
    def _check_combinations(self) -> PolicyTrainerConfig:
        if isinstance(self.backend, DeepSpeedBackendConfig) and self.compile:
            raise ValueError("compile: torch.compile is configured through backend.config with the deepspeed backend")
        self._check_trainer_logprobs()
        if self.layout == "padded" and self.row_tokens is not None:
            raise ValueError("row_tokens: caps a packed row; with layout: padded every sample is a row of its own")
        if self.input == "complete":
            self._check_complete_input()
        elif self.input == "rounds":
            self._check_round_input()
        elif self.epochs > 1 and self.idle_exit_s is None:
            raise ValueError(
                f"epochs: {self.epochs} passes need idle_exit_s, which ends the first pass (the stage's samples), "
                "or input: complete"
            )
        elif self.input_end is not None:
            raise ValueError("input_end: only input: complete reads up to an end")
        return self

    def _check_trainer_logprobs(self) -> None:
        if self.loss.behaviour_logprobs == "trainer" and self.input != "rounds":
            raise ValueError(
                "loss.behaviour_logprobs: trainer needs input: rounds (only a lockstep round's samples all come from "
                "the weights the trainer holds when it starts them)"
            )

    def _check_round_input(self) -> None:
        unused = sorted({"idle_flush_s", "idle_exit_s", "publish_every", "checkpoint_every", "input_end", "order"}
                        & self.model_fields_set)  # fmt: skip
        unused += ["publish_on_idle"] if self.publish_on_idle else []
        if unused:
            raise ValueError(
                f"{', '.join(unused)}: not used with input: rounds (one version and one checkpoint per round, each "
                "round trained in key order)"
            )

    def _check_complete_input(self) -> None:
        idle = sorted({"idle_flush_s", "idle_exit_s"} & self.model_fields_set)
        idle += ["publish_on_idle"] if self.publish_on_idle else []
        if idle:
            raise ValueError(
                f"{', '.join(idle)}: not used with input: complete (no idle time decides a step or the end)"
            )
        others = sorted(set(self.input_end or {}) - {self.topic})
        if others:
            raise ValueError(f"input_end: names {', '.join(others)}; this trainer reads only {self.topic}")

    @property
    def step_tokens(self) -> int:
        """Token budget of one optimizer step."""
        return self.batch_tokens * self.grad_accum

    @property
    def packed_row_tokens(self) -> int:
        """Token budget of one packed row: ``row_tokens``, else ``batch_tokens``."""
        return self.row_tokens if self.row_tokens is not None else self.batch_tokens

    def consumer_group(self, run_id: str) -> str:
        """``group_id``, else one derived from the run and the model.

        >>> PolicyTrainerConfig(model_name="coder/v2").consumer_group("r7")
        'r7.policy-trainer.coder-v2'
        """
        return self.group_id or f"{run_id}.policy-trainer.{_name_part(self.model_name)}"

    def static_instance_id(self, run_id: str, rank: str | None = None) -> str:
        """``instance_id``, else the consumer group and this process's rank (DeepSpeed's ranks share the group).

        >>> PolicyTrainerConfig().static_instance_id("r7", rank="3")
        'r7.policy-trainer.policy.3'
        """
        return self.instance_id or f"{self.consumer_group(run_id)}.{rank or os.environ.get('RANK') or '0'}"


def _name_part(name: str) -> str:
    """``name`` with every character a topic, group or file name may not hold replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)


def load_trainer_config(path: Path | None = None, overrides: list[str] | None = None) -> PolicyTrainerConfig:
    """The YAML file at ``path`` (or the defaults) with ``key.path=value`` overrides (values parsed as YAML).

    Raises ``ConfigError`` naming every bad field or override.
    """
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read trainer configuration {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"trainer configuration {path} must be a mapping at the top level")
        data = loaded
    for item in overrides or []:
        _apply_override(data, item)
    try:
        return PolicyTrainerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source + (" with overrides" if overrides else ""))) from exc


def _apply_override(data: dict[str, Any], item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key.path=value")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML: {exc}") from exc
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a mapping")
        node = child
    node[leaf] = value
