"""Balanced Adaptive Rollout: how many rollouts each task gets in the next round, from the outcomes seen so far.

Group-relative RL (GRPO-style) learns only from groups whose outcomes differ: in a group that all succeeds or all
fails every advantage is zero, and the compute spent on it teaches nothing. With sparse success most tasks are such
groups, so a uniform allocation wastes most of the budget. The rule here sends the budget where groups are likely
to be *mixed*.

**Estimate.** Each task keeps a Beta posterior over its success rate ``p``: prior ``Beta(a0, b0)`` (uniform by
default), plus one per success to ``a`` and one per failure to ``b``. The policy improves while it trains, so old
evidence is forgotten exponentially: before each new outcome the evidence is scaled by ``1 - 1/memory``, which caps
it at about ``memory`` outcomes (``memory=None`` keeps everything). ``CANCELLED`` episodes say nothing about the
policy and are ignored by default; every other status counts as the outcome's ``success`` field says.

**Value of a group.** A group of ``n`` rollouts is mixed with probability ``1 - p^n - (1-p)^n``. Under the posterior
its expectation has a closed form, ``m(n) = 1 - E[p^n] - E[(1-p)^n]`` with
``E[p^n] = prod_{i<n} (a+i)/(a+b+i)`` (and the same with ``b`` for failures). Each rollout of a mixed group carries a
non-zero advantage, so the value of giving a task ``n`` rollouts is the expected number of rollouts that carry signal,
``g(n) = n * m(n)``. Uncertainty is valued by itself: an unseen task (``Beta(1, 1)``) has ``m(n) = (n-1)/(n+1)``,
nearly as high as a task known to sit at ``p = 0.5``, while a task that has failed (or succeeded) every recent time
has ``m(n)`` near zero.

**Coverage.** BAR sends the budget where it expects signal, and once a task has shown mixed outcomes it outbids
unseen ones, so a few tasks get most rounds (36 distinct file-lookup tasks in 1,024 episodes): RL then fits those
tasks instead of the split. ``max_task_outcomes`` caps that: a task with that many outcomes in the run (every model's,
demonstrations included) gets no more rollouts, so later rounds go to tasks not yet tried. It is a function of the
outcomes alone, so a restarted scheduler, replaying them, allocates as before.

**Aim.** Every mixed group teaches something, but not every lesson moves a greedy answer: a task the policy solves
3 times in 4 at its sampling temperature is usually solved greedily already, and making its samples surer changes
no held-out result. With ``aim="failing"`` a group's value is ``g(n)`` times the task's expected failure rate
``E[1 - p] = b / (a + b)``, so rounds go to the mixed groups of tasks the policy mostly fails (where the greedy
answer is likely wrong) before the mixed groups of tasks it mostly solves. ``aim="mixed"`` (the default) values
every mixed group alike.

**Allocation.** Every task first gets the exploration floor ``min_rollouts`` (so estimates keep following the policy
and a task that starts to succeed is noticed); the rest of the budget is handed out greedily by the best average
marginal value ``max_k (g(n+k) - g(n)) / k`` (the look-ahead makes the greedy work for ``g``, which is not concave:
one rollout alone never carries signal), at most ``max_rollouts`` per task. Ties go to the smaller task id, so an
allocation is a pure function of the estimates. When the budget cannot give every task its floor, tasks compete for
floors by the value of a floor-sized group (unseen and uncertain tasks first).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BalancedRolloutConfig(BaseModel):
    """Settings of Balanced Adaptive Rollout (see the module docstring for the rule)."""

    model_config = ConfigDict(extra="forbid")

    budget: int = Field(64, ge=1, description="Rollouts per round, over all tasks.")
    min_rollouts: int = Field(2, ge=0, description="Exploration floor: rollouts every task gets each round.")
    max_rollouts: int = Field(32, ge=1, description="Cap on one task's rollouts (its group size) per round.")
    prior_successes: float = Field(1.0, gt=0, description="Beta prior pseudo-count of successes (a0).")
    prior_failures: float = Field(1.0, gt=0, description="Beta prior pseudo-count of failures (b0).")
    memory: float | None = Field(
        64.0, ge=1, description="About how many recent outcomes of a task its estimate remembers; None: all."
    )
    ignored_statuses: tuple[str, ...] = Field(
        ("CANCELLED",), description="Outcome statuses that are no evidence about the policy."
    )
    aim: Literal["mixed", "failing"] = Field(
        "mixed",
        description="mixed: value every expected mixed group alike; failing: weigh a task's groups by its expected "
        "failure rate, so tasks the policy mostly fails come first.",
    )
    max_task_outcomes: int | None = Field(
        None,
        ge=1,
        description="A task with this many outcomes in the run gets no more rollouts (None: no limit); spreads the "
        "rounds over the split instead of the few tasks BAR finds most uncertain.",
    )

    @model_validator(mode="after")
    def _floor_below_cap(self) -> Self:
        if self.min_rollouts > self.max_rollouts:
            raise ValueError(f"min_rollouts ({self.min_rollouts}) must not exceed max_rollouts ({self.max_rollouts})")
        return self


@dataclass(frozen=True, slots=True)
class TaskEstimate:
    """The Beta posterior of one task's success rate, and how many outcomes it has seen (before forgetting)."""

    alpha: float
    beta: float
    outcomes: int = 0

    @property
    def success_rate(self) -> float:
        """Posterior mean of the success rate."""
        return self.alpha / (self.alpha + self.beta)


def expected_mixed_probability(alpha: float, beta: float, n: int) -> float:
    """Probability that a group of ``n`` rollouts is mixed, averaged over ``p ~ Beta(alpha, beta)``.

    >>> round(expected_mixed_probability(1.0, 1.0, 4), 4)  # unseen task: (n-1)/(n+1)
    0.6
    >>> expected_mixed_probability(1.0, 1.0, 1)
    0.0
    """
    return _mixed_curve(alpha, beta, n)[n]


def _mixed_curve(alpha: float, beta: float, up_to: int) -> list[float]:
    """``m(0..up_to)``: the expected mixed probability of each group size, from running products."""
    all_succeed = all_fail = 1.0
    curve = [0.0]
    for i in range(up_to):
        all_succeed *= (alpha + i) / (alpha + beta + i)
        all_fail *= (beta + i) / (alpha + beta + i)
        curve.append(max(0.0, 1.0 - all_succeed - all_fail))
    return curve


class BalancedRollout:
    """Per-task success estimates and the allocation rule; pure logic, no I/O (the scheduler feeds it)."""

    def __init__(self, config: BalancedRolloutConfig | None = None) -> None:
        self.config = config or BalancedRolloutConfig()
        self._estimates: dict[str, TaskEstimate] = {}

    @property
    def estimates(self) -> Mapping[str, TaskEstimate]:
        """The current estimate of every task that has had an outcome."""
        return dict(self._estimates)

    def estimate(self, task_id: str) -> TaskEstimate:
        """The estimate of ``task_id`` (the prior when it has no outcome yet)."""
        return self._estimates.get(task_id) or TaskEstimate(self.config.prior_successes, self.config.prior_failures)

    def observe(self, task_id: str, success: bool, status: str | None = None) -> bool:
        """Fold one outcome into the task's estimate; False (and nothing changes) for an ignored status."""
        if status is not None and status in self.config.ignored_statuses:
            return False
        a0, b0 = self.config.prior_successes, self.config.prior_failures
        old = self.estimate(task_id)
        keep = 1.0 if self.config.memory is None else 1.0 - 1.0 / self.config.memory
        self._estimates[task_id] = TaskEstimate(
            alpha=a0 + keep * (old.alpha - a0) + (1.0 if success else 0.0),
            beta=b0 + keep * (old.beta - b0) + (0.0 if success else 1.0),
            outcomes=old.outcomes + 1,
        )
        return True

    def observe_outcome(self, record: Mapping[str, Any]) -> bool:
        """Fold a decoded ``EpisodeOutcome`` record in (``task_id``, ``success``, ``status``)."""
        return self.observe(str(record["task_id"]), bool(record["success"]), str(record["status"]))

    def signal_value(self, task_id: str, n: int) -> float:
        """``g(n)``: the expected number of rollouts carrying signal if ``task_id`` gets ``n`` of them (times the
        expected failure rate with ``aim="failing"``)."""
        estimate = self.estimate(task_id)
        return n * expected_mixed_probability(estimate.alpha, estimate.beta, n) * self._weight(estimate)

    def _weight(self, estimate: TaskEstimate) -> float:
        return 1.0 - estimate.success_rate if self.config.aim == "failing" else 1.0

    def allocate(self, task_ids: Iterable[str], budget: int | None = None) -> dict[str, int]:
        """Rollouts per task for the next round (every task listed, possibly 0), summing to at most ``budget``.

        The sum is less than the budget only when every task still eligible (under ``max_task_outcomes``) is at
        ``max_rollouts``; it is 0 once no task is.
        """
        listed = sorted(set(task_ids))
        remaining = self.config.budget if budget is None else budget
        if remaining < 0:
            raise ValueError(f"budget must be >= 0, got {remaining}")
        limit = self.config.max_task_outcomes
        tasks = [task for task in listed if limit is None or self.estimate(task).outcomes < limit]
        cap = self.config.max_rollouts
        values = {task: self._values(task, cap) for task in tasks}
        counts = dict.fromkeys(listed, 0) | self._floors(tasks, values, remaining)
        remaining -= sum(counts.values())
        heap = [entry for task in tasks if (entry := _best_step(task, values[task], counts[task])) is not None]
        heapq.heapify(heap)
        while remaining > 0 and heap:
            _, task, step = heapq.heappop(heap)
            counts[task] += min(step, remaining)
            remaining -= min(step, remaining)
            entry = _best_step(task, values[task], counts[task])
            if entry is not None:
                heapq.heappush(heap, entry)
        return counts

    def _values(self, task_id: str, cap: int) -> list[float]:
        estimate = self.estimate(task_id)
        curve = _mixed_curve(estimate.alpha, estimate.beta, cap)
        weight = self._weight(estimate)
        return [n * mixed * weight for n, mixed in enumerate(curve)]

    def _floors(self, tasks: Sequence[str], values: Mapping[str, list[float]], budget: int) -> dict[str, int]:
        floor = self.config.min_rollouts
        if floor * len(tasks) <= budget:
            return dict.fromkeys(tasks, floor)
        counts = dict.fromkeys(tasks, 0)
        # Not enough for everyone: the most valuable floor-sized groups first, unseen tasks before seen ones.
        ranked = sorted(tasks, key=lambda task: (-values[task][floor], self.estimate(task).outcomes, task))
        for task in ranked[: budget // floor] if floor else ():
            counts[task] = floor
        return counts


def _best_step(task: str, values: Sequence[float], count: int) -> tuple[float, str, int] | None:
    """Heap entry ``(-rate, task, k)`` for the ``k`` more rollouts with the best average gain; None at the cap."""
    best_rate, best_k = -1.0, 0
    for k in range(1, len(values) - count):
        rate = (values[count + k] - values[count]) / k
        if rate > best_rate + 1e-12:
            best_rate, best_k = rate, k
    return None if best_k == 0 else (-best_rate, task, best_k)
