"""Held-out evaluation of a policy: run every task of an eval split through Orchard Env, wait for the outcomes on
the bus, and summarise them (success rate with a Wilson 95% interval, mean reward with its interval).

Each task is submitted ``samples_per_task`` times (K > 1 for best-of-K reranking) under the group id
``eval-<stage>-<task>``, with episode ids derived from run, stage, task and index. Submitting the same stage again
is therefore idempotent: Env answers 409 for episodes it already has (``EnvSubmitter`` counts that as submitted),
and their outcomes are read back from the start of the ``outcomes`` topic. An episode with no outcome when the
timeout passes counts as a failure with reward 0 and is listed in ``HeldoutResult.missing``.

With K samples the ``selection`` decides which episode counts for the task: ``first`` (the first, what a random
pick scores on average), ``pass`` (the first successful one, else the first: pass@K, ``orchard eval --attempts K``)
or ``rerank`` (a ``Picker`` such as the value-model reranker of ``orchard eval --rerank K``). ``mean_success``
(pass@1, over every attempt) and ``any_success`` (pass@K) are reported beside it; ``HeldoutResult.selection`` names
how the figure was obtained (``first``, ``pass@K``, ``rerank@K``).

Each task's ``labels`` (from its ``task.yaml``) come along, and the results are broken down by the labels in
``HeldoutConfig.by`` (``orchard.evaluation.breakdown``). The cost (model calls, tokens, wall and episode time) is
summed from the outcomes and the episodes' model calls (``orchard.evaluation.cost``).

Group ids start with ``EVAL_GROUP_PREFIX`` so consumers and plots can tell evaluation episodes from training ones.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.bus import Bus, Record
from orchard.codec import Codec
from orchard.episode_groups import EVAL_GROUP_PREFIX, is_eval_group  # noqa: F401 - re-exported
from orchard.episode_requests import EpisodeRequest, SubmitFn, seeded_options
from orchard.evaluation.breakdown import LabelGroup, breakdown
from orchard.evaluation.cost import EvalCost, TokenCount, cost_of, read_token_counts
from orchard.evaluation.stats import CiMethod, MeanStats, SuccessStats, mean_stats, success_stats_of
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import MODEL_CALLS, OUTCOMES

log = get_logger("orchard.evaluation")

MISSING = "MISSING"
"""The status of an episode that had no outcome by the deadline."""
Selection = Literal["first", "pass", "rerank"]
TaskLabels = Mapping[str, Mapping[str, str]]
"""Labels of each task, by task id."""


class HeldoutConfig(BaseModel):
    """What to evaluate and how long to wait."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(..., min_length=1, description="Run whose Env publishes the outcomes (the config's run_id).")
    stage: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Name of the evaluated stage.")
    harness: str = Field(..., min_length=1, description="Harness of every episode.")
    model: str = Field(..., min_length=1, description="Model name the harness asks the proxy for.")
    samples_per_task: int = Field(1, ge=1, description="Episodes per task (K of pass@K or best-of-K).")
    selection: Selection = Field(
        "first",
        description="Which of a task's K episodes counts: 'first', 'pass' (any success: pass@K) or 'rerank' (the "
        "picker given to evaluate_heldout).",
    )
    by: list[str] = Field(default_factory=list, description="Task labels to break the results down by.")
    timeout_s: float = Field(1800.0, gt=0, description="Longest wait for all outcomes after the last submission.")
    episode_timeout_s: float | None = Field(None, gt=0, description="Override of Env's episode timeout.")
    options: dict[str, Any] = Field(default_factory=dict, description="Harness- or task-specific settings.")
    greedy_first: bool = Field(
        False,
        description="With K > 1: a task's first episode decodes greedily (harness temperature 0), the others as "
        "options say, so a reranker's candidates include what greedy decoding would give.",
    )
    seed: int | None = Field(
        None, ge=0, description="Give each episode's harness a sampling seed derived from this and its episode id."
    )
    topic: str = Field(OUTCOMES, min_length=1, description="Topic of EpisodeOutcome records.")
    ci_method: CiMethod = Field("normal", description="Interval of the mean reward: 'normal' or 'bootstrap'.")
    count_tokens: bool = Field(True, description="Read the episodes' model calls to count their tokens.")
    calls_topic: str = Field(MODEL_CALLS, min_length=1, description="Topic of ModelCall records (token counts).")
    tokens_timeout_s: float = Field(
        60.0, gt=0, description="Longest time spent reading model calls once the outcomes are in."
    )

    @property
    def selection_label(self) -> str:
        """How the stage's figure is obtained: ``first``, ``pass@K`` or ``rerank@K`` (``first`` whenever K is 1)."""
        k = self.samples_per_task
        return "first" if k == 1 or self.selection == "first" else f"{self.selection}@{k}"


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
    num_model_calls: int = 0
    started_at_ms: int | None = None
    ended_at_ms: int | None = None

    @property
    def finished(self) -> bool:
        """Whether an outcome arrived."""
        return self.status != MISSING

    @property
    def duration_s(self) -> float | None:
        """Seconds from the episode's start to its outcome (None without an outcome)."""
        if self.started_at_ms is None or self.ended_at_ms is None:
            return None
        return max(0, self.ended_at_ms - self.started_at_ms) / 1000.0


Picker = Callable[[str, Sequence[EpisodeResult]], EpisodeResult]
"""Chooses, among a task's K episodes (ordered by index), the one whose outcome counts for the task."""


def first_candidate(task_id: str, candidates: Sequence[EpisodeResult]) -> EpisodeResult:
    """The default ``Picker``: the first sample (an unbiased random pick)."""
    return candidates[0]


def first_success(task_id: str, candidates: Sequence[EpisodeResult]) -> EpisodeResult:
    """The ``Picker`` of pass@K: the first successful sample, else the first (the task counts as solved when any
    attempt succeeds)."""
    return next((candidate for candidate in candidates if candidate.success), candidates[0])


@dataclass
class TaskResult:
    """A task's episodes and the one that counts."""

    task_id: str
    episodes: list[EpisodeResult]
    chosen: EpisodeResult
    labels: dict[str, str] = field(default_factory=dict)


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
    selection: str = "first"
    breakdowns: dict[str, list[LabelGroup]] = field(default_factory=dict)
    cost: EvalCost | None = None

    def to_json(self) -> dict[str, Any]:
        """The stage as JSON-ready data: summary, breakdowns, cost and per-task detail (labels, every episode)."""
        return {
            "stage": self.stage,
            "run_id": self.run_id,
            "samples_per_task": self.samples_per_task,
            "selection": self.selection,
            "summary": self._summary_json(),
            "breakdown": {label: [g.to_json() for g in groups] for label, groups in self.breakdowns.items()},
            "cost": None if self.cost is None else self.cost.to_json(),
            "missing": self.missing,
            "tasks": [
                {
                    "task_id": task.task_id,
                    "labels": task.labels,
                    "chosen": task.chosen.episode_id,
                    "episodes": [_episode_json(episode) for episode in task.episodes],
                }
                for task in self.tasks
            ],
        }

    def _summary_json(self) -> dict[str, Any]:
        return {
            "tasks": self.success.n,
            "successes": self.success.successes,
            "success_rate": self.success.rate,
            "success_ci": [self.success.low, self.success.high],
            "pass_at_1": self.mean_success,
            "pass_at_k": self.any_success,
            "mean_reward": self.reward.mean,
            "reward_ci": [self.reward.low, self.reward.high],
            "reward_ci_method": self.reward.method,
            "wall_time_s": self.wall_time_s,
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
        "num_model_calls": episode.num_model_calls,
        "started_at_ms": episode.started_at_ms,
        "ended_at_ms": episode.ended_at_ms,
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
            options=seeded_options(
                _greedy(config.options) if config.greedy_first and index == 0 else config.options,
                config.seed,
                eval_episode_id(config.run_id, config.stage, task_id, index),
            ),
        )
        for task_id in task_ids
        for index in range(config.samples_per_task)
    ]


def _greedy(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the harness's temperature set to 0."""
    return {**options, "harness": {**dict(options.get("harness") or {}), "temperature": 0.0}}


def evaluate_heldout(
    bus: Bus,
    config: HeldoutConfig,
    task_ids: Sequence[str],
    submit: SubmitFn,
    *,
    picker: Picker | None = None,
    labels: TaskLabels | None = None,
    codec: Codec | None = None,
) -> HeldoutResult:
    """Submit every episode, wait for their outcomes (up to ``config.timeout_s``), count their tokens (up to
    ``config.tokens_timeout_s`` more), and summarise them. ``picker`` is the chooser of ``selection='rerank'``
    (required there, refused otherwise); ``labels`` are each task's labels (for the breakdowns)."""
    chooser = picker_for(config, picker)
    codec = codec or Codec.default()
    started = time.monotonic()
    requests = plan_episodes(config, task_ids)
    bus.create_topic(config.topic, exist_ok=True)
    for request in requests:
        submit(request)
    log.info("evaluation submitted", run_id=config.run_id, stage=config.stage, episodes=len(requests))
    outcomes = wait_for_outcomes(bus, config, {r.episode_id for r in requests}, codec)
    wall_time_s = time.monotonic() - started
    tokens = count_tokens(bus, config, outcomes, codec) if config.count_tokens else None
    result = summarise(config, requests, outcomes, chooser, wall_time_s, labels=labels, tokens=tokens)
    if result.missing:
        log.warning("evaluation episodes without outcome", stage=config.stage, missing=len(result.missing))
    return result


def picker_for(config: HeldoutConfig, picker: Picker | None) -> Picker:
    """The picker of ``config.selection``; ``ValueError`` when ``picker`` does not fit it."""
    if config.selection == "rerank":
        if picker is None:
            raise ValueError("selection 'rerank' needs a picker (e.g. the value-model reranker)")
        return picker
    if picker is not None:
        raise ValueError(f"a picker is only used with selection 'rerank', not {config.selection!r}")
    return first_success if config.selection == "pass" else first_candidate


def count_tokens(
    bus: Bus, config: HeldoutConfig, outcomes: Mapping[str, Mapping[str, Any]], codec: Codec
) -> TokenCount | None:
    """The tokens of the model calls of the episodes with an outcome (their calls are on the bus by then: the proxy
    confirms every call before Env publishes the outcome), read from just before the earliest episode start."""
    expected = {episode_id: int(o.get("num_model_calls") or 0) for episode_id, o in outcomes.items()}
    expected = {episode_id: calls for episode_id, calls in expected.items() if calls > 0}
    starts = [_millis(o.get("started_at")) for o in outcomes.values()]
    known = [start for start in starts if start is not None]
    return read_token_counts(
        bus,
        expected,
        deadline=time.monotonic() + config.tokens_timeout_s,
        since_ms=min(known) if known else None,
        topic=config.calls_topic,
        codec=codec,
    )


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
    *,
    labels: TaskLabels | None = None,
    tokens: TokenCount | None = None,
) -> HeldoutResult:
    """Per-task results, the stage's statistics, breakdowns and cost from the outcomes that arrived."""
    by_task: dict[str, list[EpisodeResult]] = {}
    for request in requests:  # plan_episodes lists a task's samples in index order
        episodes = by_task.setdefault(request.task_id, [])
        episodes.append(_result(request, len(episodes), outcomes.get(request.episode_id)))
    labels = labels or {}
    tasks = [
        TaskResult(task_id, episodes, picker(task_id, episodes), dict(labels.get(task_id, {})))
        for task_id, episodes in by_task.items()
    ]
    every = [episode for task in tasks for episode in task.episodes]
    durations = [d for d in (e.duration_s for e in every) if d is not None]
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
        selection=config.selection_label,
        breakdowns={label: breakdown(tasks, label) for label in config.by},
        cost=cost_of([e.num_model_calls for e in every if e.finished], durations, wall_time_s, tokens),
    )


def _result(request: EpisodeRequest, index: int, outcome: Mapping[str, Any] | None) -> EpisodeResult:
    if outcome is None:
        return EpisodeResult(request.episode_id, request.task_id, index, error="no outcome before the timeout")
    version = outcome.get("policy_version")
    calls = outcome.get("num_model_calls")
    return EpisodeResult(
        episode_id=request.episode_id,
        task_id=request.task_id,
        index=index,
        status=str(outcome["status"]),
        success=bool(outcome["success"]),
        reward=float(outcome["reward"]),
        policy_version=None if version is None else int(version),
        error=outcome.get("error"),
        num_model_calls=int(calls or 0),
        started_at_ms=_millis(outcome.get("started_at")),
        ended_at_ms=_millis(outcome.get("ended_at")),
    )


def _millis(value: Any) -> int | None:
    """Milliseconds since the epoch of a decoded ``timestamp-millis`` (a ``datetime``) or a plain number."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    return int(value)
