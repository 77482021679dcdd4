"""Settings of the stream consumers (``consumers:`` in the Orchard config file)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from consumers.groups import GroupBy
from consumers.samples import SampleBuilderConfig
from consumers.start import ConsumerStart
from orchard.logging import get_logger

log = get_logger("consumers.config")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuntimeConfig(_Strict):
    """How the consumer runtime polls and commits (shared by every consumer)."""

    max_poll_records: int = Field(500, ge=1, le=100_000, description="Most records one poll returns.")
    transaction_interval_s: float = Field(
        0.1,
        ge=0,
        le=10.0,
        description="While records are waiting (a poll that does not wait returns some), a transaction stays open "
        "for further polls until it is this old (0: one poll per transaction); an empty poll commits it at once. "
        "Outputs are visible only once committed: this bounds the latency it adds. Fewer, larger transactions "
        "cost less per record, and a state key written and deleted within one transaction never reaches the "
        "changelog.",
    )
    transaction_max_records: int = Field(
        10_000, ge=1, description="...or until it holds this many input records (bounds the outputs held in memory)."
    )
    poll_timeout_s: float = Field(
        0.5, gt=0, le=1.0, description="Longest wait for records (at most 1 s, so a stop signal is seen)."
    )
    progress_interval_s: float = Field(10.0, gt=0, description="Seconds between progress log lines.")
    restore_stall_s: float = Field(
        30.0,
        gt=0,
        description="A state restore that reads nothing new for this long stops the consumer with an "
        "error (it reads its changelog and referenced inputs to their ends, never less).",
    )
    restore_idle_polls: int | None = Field(
        None, ge=1, description="Deprecated and ignored: a restore no longer ends on empty polls (restore_stall_s)."
    )

    @model_validator(mode="after")
    def _warn_deprecated(self) -> RuntimeConfig:
        if self.restore_idle_polls is not None:
            log.warning("consumers.runtime.restore_idle_polls is deprecated and ignored: a state restore reads to "
                        "the end offsets and stops only after restore_stall_s without progress")  # fmt: skip
        return self

    start: ConsumerStart = Field(
        "earliest",
        description="Where a consumer group with no committed offset starts: 'earliest', 'latest', 'stage' (the "
        "start of the run stage that started it) or a time in ms since the epoch (consumers.start).",
    )


class AssemblerConfig(_Strict):
    """When the trajectory assembler gives up waiting and emits an episode as incomplete."""

    outcome_timeout_s: float = Field(
        7200.0, gt=0, description="No outcome this long after an episode's latest model call: emit it incomplete."
    )
    calls_timeout_s: float = Field(
        600.0, gt=0, description="Model calls still missing this long after the outcome: emit it incomplete."
    )
    closed_retention_s: float = Field(
        86_400.0,
        gt=0,
        description="How long an emitted episode is remembered, so late duplicates are dropped rather than "
        "starting a second trajectory (a late call of an incomplete one goes to the dead letters).",
    )


class RewardsConfig(_Strict):
    """How a reward consumer feeds a plug-in that scores whole rollout groups (``needs_groups = True``); plug-ins
    that score one episode at a time ignore it."""

    group_size: int | None = Field(
        None,
        ge=1,
        description="A rollout group is scored once it has this many trajectories; null: sample_builder.group_size "
        "(the groups the sample builder forms).",
    )
    group_timeout_ms: int = Field(
        60_000,
        ge=0,
        description="...or this long (event time) after its first trajectory came. Keep it below "
        "sample_builder.score_wait_ms, or the sample builder stops waiting for the group's scores first.",
    )
    group_by: GroupBy | None = Field(
        None,
        description="'auto' (group_id, else task + policy version) or 'task_version'; null: sample_builder.group_by.",
    )


class ConsumersConfig(_Strict):
    """Everything the consumers read from config: the runtime, the assembler, the reward consumers and the sample
    builder."""

    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    assembler: AssemblerConfig = Field(default_factory=AssemblerConfig)
    rewards: RewardsConfig = Field(default_factory=RewardsConfig)
    sample_builder: SampleBuilderConfig = Field(default_factory=SampleBuilderConfig)
