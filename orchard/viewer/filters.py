"""The episode list's filters: run, task, status, stage, policy version, reward range and kind (training or held-out).

Values are checked before anything is filtered, so a typo answers 422 naming the value and what it may be, rather
than an empty list that looks like "no such episodes".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchard.viewer.exceptions import BadQueryError
from orchard.viewer.index import NO_OUTCOME

STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "CRASHED", "CANCELLED", NO_OUTCOME)
NO_STAGE = "-"  # the stage filter's name for episodes outside every stage
Kind = Literal["all", "train", "eval"]


@dataclass(frozen=True, slots=True)
class EpisodeFilter:
    """Which episodes are listed; None (or ``kind="all"``) means any."""

    run: str | None = None
    task: str | None = None
    status: str | None = None
    stage: str | None = None
    policy_version: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    kind: Kind = "all"

    def check(self, stages: Collection[str]) -> EpisodeFilter:
        """``self`` if every value can match something; ``BadQueryError`` naming the first that cannot.

        >>> EpisodeFilter(stage="rl").check(["sft"])
        Traceback (most recent call last):
        ...
        orchard.viewer.exceptions.BadQueryError: stage 'rl' is not a stage of this run (sft, -)
        """
        if self.status is not None and self.status not in STATUSES:
            raise BadQueryError(f"status {self.status!r} is not one of {', '.join(STATUSES)}")
        if self.stage is not None and self.stage != NO_STAGE and self.stage not in stages:
            known = ", ".join([*stages, NO_STAGE])
            raise BadQueryError(f"stage {self.stage!r} is not a stage of this run ({known})")
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise BadQueryError(f"reward_min {self.reward_min} is above reward_max {self.reward_max}")
        return self

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether the summary ``row`` (``EpisodeRecords.summary``) passes every filter."""
        equal = (("run_id", self.run), ("task_id", self.task), ("status", self.status),
                 ("policy_version", self.policy_version))  # fmt: skip
        if any(wanted is not None and row[key] != wanted for key, wanted in equal):
            return False
        if self.stage is not None and (row["stage"] or NO_STAGE) != self.stage:
            return False
        if self.kind != "all" and row["eval"] != (self.kind == "eval"):
            return False
        return self._reward_matches(row["reward"])

    def _reward_matches(self, reward: float | None) -> bool:
        if self.reward_min is None and self.reward_max is None:
            return True
        if reward is None:
            return False
        return (self.reward_min is None or reward >= self.reward_min) and (
            self.reward_max is None or reward <= self.reward_max
        )
