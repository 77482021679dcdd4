"""Results broken down by a task label (``labels`` in ``task.yaml``, e.g. ``repo``): per label value, the success
rate of the tasks carrying it with its Wilson 95% interval, and pass@1 over their attempts.

A task without the label falls in the group ``NO_VALUE``. With no ``--by``, ``orchard eval`` breaks down by
``repo`` when every task has that label (SWE suites do), else not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchard.evaluation.exceptions import EvaluationError
from orchard.evaluation.stats import SuccessStats, success_stats_of

if TYPE_CHECKING:
    from orchard.evaluation.heldout import TaskResult

NO_VALUE = "(none)"
"""The group of tasks that lack the label."""
DEFAULT_LABEL = "repo"


@dataclass(frozen=True, slots=True)
class LabelGroup:
    """The tasks whose ``label`` is ``value``: the success of the episodes that count, and pass@1 over all attempts."""

    label: str
    value: str
    success: SuccessStats
    attempts: int
    attempt_successes: int

    @property
    def pass_at_1(self) -> float:
        """Mean success over every attempt of the group's tasks."""
        return self.attempt_successes / self.attempts if self.attempts else 0.0

    def to_json(self) -> dict[str, Any]:
        """The group as JSON-ready data."""
        return {
            "value": self.value,
            "tasks": self.success.n,
            "successes": self.success.successes,
            "success_rate": self.success.rate,
            "success_ci": [self.success.low, self.success.high],
            "attempts": self.attempts,
            "pass_at_1": self.pass_at_1,
        }


def breakdown(tasks: Sequence[TaskResult], label: str) -> list[LabelGroup]:
    """The groups of ``tasks`` by their value of ``label``, sorted by value (``NO_VALUE`` last)."""
    groups: dict[str, list[TaskResult]] = {}
    for task in tasks:
        groups.setdefault(task.labels.get(label, NO_VALUE), []).append(task)
    return [
        LabelGroup(
            label=label,
            value=value,
            success=success_stats_of([task.chosen.success for task in members]),
            attempts=sum(len(task.episodes) for task in members),
            attempt_successes=sum(episode.success for task in members for episode in task.episodes),
        )
        for value, members in sorted(groups.items(), key=lambda item: (item[0] == NO_VALUE, item[0]))
    ]


def breakdown_labels(requested: Sequence[str] | None, task_labels: Iterable[Mapping[str, str]]) -> list[str]:
    """The labels to break down by: ``requested`` (each must be on at least one task), else ``DEFAULT_LABEL`` when
    every task has it, else none.

    >>> breakdown_labels(None, [{"repo": "a"}, {"repo": "b", "kind": "logic"}])
    ['repo']
    >>> breakdown_labels(None, [{"repo": "a"}, {}])
    []
    """
    labels = list(task_labels)
    if not requested:
        return [DEFAULT_LABEL] if labels and all(DEFAULT_LABEL in task for task in labels) else []
    present = sorted({name for task in labels for name in task})
    unknown = [name for name in requested if name not in present]
    if unknown:
        raise EvaluationError(
            f"--by {', '.join(unknown)}: no task has that label (labels of these tasks: {', '.join(present) or 'none'})"
        )
    return list(dict.fromkeys(requested))  # a label given twice is broken down once
