"""Held-out evaluation of a policy: run every task of an eval split through Orchard Env, wait for the outcomes on
the bus, and summarise them (success rate with a Wilson 95% interval, mean reward with its interval).

Each task is submitted ``samples_per_task`` times (K > 1 for best-of-K reranking) under the group id
``eval-<stage>-<task>``, with episode ids derived from run, stage, task and index. Submitting the same stage again
is therefore idempotent: Env answers 409 for episodes it already has (``EnvSubmitter`` counts that as submitted),
and their outcomes are read back from the start of the ``outcomes`` topic. An episode with no outcome when the
timeout passes counts as a failure with reward 0 and is listed in ``HeldoutResult.missing``.

With K samples a ``Picker`` chooses the candidate whose outcome counts for the task (the value-model reranker in
``orchard eval --rerank K``); without one the first candidate counts, which is what a random pick scores on
average. ``mean_success`` (over every sample) and ``any_success`` (pass@K) are reported beside it.

Group ids start with ``EVAL_GROUP_PREFIX`` so consumers and plots can tell evaluation episodes from training ones.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchard.bus import Bus, Record
from orchard.codec import Codec
from orchard.episode_groups import EVAL_GROUP_PREFIX, is_eval_group  # noqa: F401 - re-exported
from orchard.evaluation.stats import CiMethod, MeanStats, SuccessStats, mean_stats, success_stats_of
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import OUTCOMES
from producers.rollout.scheduler import EpisodeRequest

log = get_logger("orchard.evaluation")

MISSING = "MISSING"
"""The status of an episode that had no outcome by the deadline."""
SubmitFn = Callable[[EpisodeRequest], None]


class HeldoutConfig(BaseModel):
    """What to evaluate and how long to wait."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(..., min_length=1, description="Run whose Env publishes the outcomes (the config's run_id).")
    stage: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Name of the evaluated stage.")
    harness: str = Field(..., min_length=1, description="Harness of every episode.")
    model: str = Field(..., min_length=1, description="Model name the harness asks the proxy for.")
    samples_per_task: int = Field(1, ge=1, description="Episodes per task (K of best-of-K).")
    timeout_s: float = Field(1800.0, gt=0, description="Longest wait for all outcomes after the last submission.")
    episode_timeout_s: float | None = Field(None, gt=0, description="Override of Env's episode timeout.")
    options: dict[str, Any] = Field(default_factory=dict, description="Harness- or task-specific settings.")
    topic: str = Field(OUTCOMES, min_length=1, description="Topic of EpisodeOutcome records.")
    ci_method: CiMethod = Field("normal", description="Interval of the mean reward: 'normal' or 'bootstrap'.")


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """One evaluation episode: its outcome's fields, or ``MISSING`` (a failure with reward 0)."""

    episode_id: str
    task_id: str
    index: int
    status: str = MISSING
    success: bool = False
    reward: float = 0.0
    policy_version: int | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        """Whether an outcome arrived."""
        return self.status != MISSING


Picker = Callable[[str, Sequence[EpisodeResult]], EpisodeResult]
"""Chooses, among a task's K episodes (ordered by index), the one whose outcome counts for the task."""


def first_candidate(task_id: str, candidates: Sequence[EpisodeResult]) -> EpisodeResult:
    """The default ``Picker``: the first sample (an unbiased random pick)."""
    return candidates[0]


@dataclass
class TaskResult:
    """A task's episodes and the one that counts."""

    task_id: str
    episodes: list[EpisodeResult]
    chosen: EpisodeResult


@dataclass
class HeldoutResult:
    """The evaluation of one stage."""

    stage: str
    run_id: str
    samples_per_task: int
    tasks: list[TaskResult]
    success: SuccessStats
    reward: MeanStats
    wall_time_s: float
    mean_success: float
    any_success: float
    missing: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Per-task detail as JSON-ready data."""
        return {
            "stage": self.stage,
            "run_id": self.run_id,
            "samples_per_task": self.samples_per_task,
            "missing": self.missing,
            "tasks": [
                {
                    "task_id": task.task_id,
                    "chosen": task.chosen.episode_id,
                    "episodes": [_episode_json(episode) for episode in task.episodes],
                }
                for task in self.tasks
            ],
        }


def _episode_json(episode: EpisodeResult) -> dict[str, Any]:
    return {
        "episode_id": episode.episode_id,
        "index": episode.index,
        "status": episode.status,
        "success": episode.success,
        "reward": episode.reward,
        "policy_version": episode.policy_version,
        "error": episode.error,
    }


def eval_group_id(stage: str, task_id: str) -> str:
    """The group id of a stage's evaluation episodes of ``task_id``."""
    return f"{EVAL_GROUP_PREFIX}{stage}-{task_id}"


def eval_episode_id(run_id: str, stage: str, task_id: str, index: int) -> str:
    """A deterministic episode id (Env's pattern: lower-case letters, digits and '-', at most 63 characters)."""
    digest = hashlib.blake2b(f"{run_id}\0eval\0{stage}\0{task_id}".encode(), digest_size=10).hexdigest()
    return f"v{digest}-{index}"


def plan_episodes(config: HeldoutConfig, task_ids: Sequence[str]) -> list[EpisodeRequest]:
    """The episodes to submit: ``samples_per_task`` per task, in task order."""
    if not task_ids:
        raise ValueError("a held-out evaluation needs at least one task")
    if len(set(task_ids)) != len(task_ids):
        raise ValueError("task ids of a held-out evaluation must be unique")
    return [
        EpisodeRequest(
            task_id=task_id,
            group_id=eval_group_id(config.stage, task_id),
            episode_id=eval_episode_id(config.run_id, config.stage, task_id, index),
            harness=config.harness,
            model=config.model,
            timeout_s=config.episode_timeout_s,
            options=config.options,
        )
        for task_id in task_ids
        for index in range(config.samples_per_task)
    ]


def evaluate_heldout(
    bus: Bus,
    config: HeldoutConfig,
    task_ids: Sequence[str],
    submit: SubmitFn,
    *,
    picker: Picker | None = None,
    codec: Codec | None = None,
) -> HeldoutResult:
    """Submit every episode, wait for their outcomes (up to ``config.timeout_s``), and summarise them."""
    started = time.monotonic()
    requests = plan_episodes(config, task_ids)
    bus.create_topic(config.topic, exist_ok=True)
    for request in requests:
        submit(request)
    log.info("evaluation submitted", run_id=config.run_id, stage=config.stage, episodes=len(requests))
    outcomes = wait_for_outcomes(bus, config, {r.episode_id for r in requests}, codec or Codec.default())
    result = summarise(config, requests, outcomes, picker or first_candidate, time.monotonic() - started)
    if result.missing:
        log.warning("evaluation episodes without outcome", stage=config.stage, missing=len(result.missing))
    return result


def wait_for_outcomes(
    bus: Bus, config: HeldoutConfig, episode_ids: set[str], codec: Codec, *, poll_s: float = 1.0
) -> dict[str, Mapping[str, Any]]:
    """The outcomes of ``episode_ids`` (by episode id), read from the start of the topic until all are in or the
    timeout passes; the first outcome of an episode wins."""
    found: dict[str, Mapping[str, Any]] = {}
    deadline = time.monotonic() + config.timeout_s
    with bus.consumer([config.topic], group=None, start="earliest") as consumer:
        while len(found) < len(episode_ids) and time.monotonic() < deadline:
            remaining = max(0.0, deadline - time.monotonic())
            for outcome in _decode(consumer.poll(timeout_s=min(poll_s, remaining)), episode_ids, codec):
                if outcome["run_id"] == config.run_id:
                    found.setdefault(str(outcome["episode_id"]), outcome)
    return found


def _decode(records: Iterable[Record], wanted: set[str], codec: Codec) -> Iterable[Mapping[str, Any]]:
    for record in records:
        # outcomes are keyed by episode id: skip other episodes without decoding them
        if record.key is not None and record.key.decode("utf-8", "replace") not in wanted:
            continue
        try:
            decoded = codec.decode(record.value)
        except SerializationError as exc:
            log.warning("undecodable outcome skipped", partition=record.partition, offset=record.offset, error=str(exc))
            continue
        if decoded.name == "EpisodeOutcome" and decoded.record["episode_id"] in wanted:
            yield decoded.record


def summarise(
    config: HeldoutConfig,
    requests: Sequence[EpisodeRequest],
    outcomes: Mapping[str, Mapping[str, Any]],
    picker: Picker,
    wall_time_s: float,
) -> HeldoutResult:
    """Per-task results and the stage's statistics from the outcomes that arrived."""
    by_task: dict[str, list[EpisodeResult]] = {}
    for request in requests:  # plan_episodes lists a task's samples in index order
        episodes = by_task.setdefault(request.task_id, [])
        episodes.append(_result(request, len(episodes), outcomes.get(request.episode_id)))
    tasks = [TaskResult(task_id, episodes, picker(task_id, episodes)) for task_id, episodes in by_task.items()]
    every = [episode for task in tasks for episode in task.episodes]
    return HeldoutResult(
        stage=config.stage,
        run_id=config.run_id,
        samples_per_task=config.samples_per_task,
        tasks=tasks,
        success=success_stats_of([task.chosen.success for task in tasks]),
        reward=mean_stats([task.chosen.reward for task in tasks], config.ci_method),
        wall_time_s=wall_time_s,
        mean_success=sum(e.success for e in every) / len(every),
        any_success=sum(any(e.success for e in task.episodes) for task in tasks) / len(tasks),
        missing=[episode.episode_id for episode in every if not episode.finished],
    )


def _result(request: EpisodeRequest, index: int, outcome: Mapping[str, Any] | None) -> EpisodeResult:
    if outcome is None:
        return EpisodeResult(request.episode_id, request.task_id, index, error="no outcome before the timeout")
    version = outcome.get("policy_version")
    return EpisodeResult(
        episode_id=request.episode_id,
        task_id=request.task_id,
        index=index,
        status=str(outcome["status"]),
        success=bool(outcome["success"]),
        reward=float(outcome["reward"]),
        policy_version=None if version is None else int(version),
        error=outcome.get("error"),
    )
