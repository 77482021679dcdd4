"""A benchmark-free simulation of rollout allocation: tasks with known success rates, Bernoulli outcomes.

It measures what Balanced Adaptive Rollout is for: how many rollouts land in *mixed* groups (the ones whose
group-relative advantages are non-zero), against a uniform split of the same budget, with the same seed::

    rates = {"never": 0.0, "coin": 0.5, "always": 1.0}
    balanced = simulate(rates, BalancedRollout(BalancedRolloutConfig(budget=24)), rounds=30, seed=0)
    uniform = simulate(rates, UniformAllocation(budget=24), rounds=30, seed=0)
    assert balanced.signal_rollouts > uniform.signal_rollouts
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from producers.rollout.balanced import BalancedRollout


class Allocator(Protocol):
    """Anything that sizes a round and learns from outcomes (``BalancedRollout`` is one)."""

    def allocate(self, task_ids: Iterable[str], budget: int | None = None) -> dict[str, int]:
        """Rollouts per task for the next round."""
        ...

    def observe(self, task_id: str, success: bool, status: str | None = None) -> bool:
        """Learn from one outcome."""
        ...


@dataclass
class UniformAllocation:
    """The baseline: the budget split evenly over tasks (the remainder to the first tasks by id); learns nothing."""

    budget: int

    def allocate(self, task_ids: Iterable[str], budget: int | None = None) -> dict[str, int]:
        """An even split of ``budget`` (or the configured one)."""
        tasks = sorted(set(task_ids))
        total = self.budget if budget is None else budget
        share, extra = divmod(total, len(tasks)) if tasks else (0, 0)
        return {task: share + (1 if index < extra else 0) for index, task in enumerate(tasks)}

    def observe(self, task_id: str, success: bool, status: str | None = None) -> bool:
        """Uniform allocation ignores outcomes."""
        return False


@dataclass
class SimulationResult:
    """Totals of one simulation and each round's allocation."""

    rollouts: int = 0
    groups: int = 0
    mixed_groups: int = 0
    signal_rollouts: int = 0  # rollouts in mixed groups: the ones with a non-zero group-relative advantage
    allocations: list[dict[str, int]] = field(default_factory=list)

    @property
    def signal_fraction(self) -> float:
        """Share of all rollouts that carried learning signal."""
        return self.signal_rollouts / self.rollouts if self.rollouts else 0.0


def simulate(
    success_rates: Mapping[str, float], allocator: Allocator | BalancedRollout, *, rounds: int, seed: int = 0
) -> SimulationResult:
    """Run ``rounds`` rounds: allocate, draw each rollout's success from its task's rate, feed the outcomes back."""
    for task, rate in success_rates.items():
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"success rate of task {task!r} must be in [0, 1], got {rate}")
    rng = random.Random(seed)  # noqa: S311 - a reproducible simulation, not cryptography
    result = SimulationResult()
    for _ in range(rounds):
        allocation = allocator.allocate(success_rates)
        result.allocations.append(allocation)
        for task in sorted(allocation):
            outcomes = [rng.random() < success_rates[task] for _ in range(allocation[task])]
            for success in outcomes:
                allocator.observe(task, success)
            _tally(result, outcomes)
    return result


def _tally(result: SimulationResult, outcomes: list[bool]) -> None:
    if not outcomes:
        return
    result.rollouts += len(outcomes)
    result.groups += 1
    if 0 < sum(outcomes) < len(outcomes):
        result.mixed_groups += 1
        result.signal_rollouts += len(outcomes)
