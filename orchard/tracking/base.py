"""The tracker interface: scalars at a step, a table at a step, close.

What a point is about (the run, the stage, the policy version) is in its names and ``tags``: a tracker keeps the
names as they are (``trainer/policy/loss``) and may keep the tags beside the values where it can (W&B does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Scalars:
    """Values that share a step: names (``a/b/c``) to numbers, the step, when they were measured, and tags."""

    values: Mapping[str, float]
    step: int
    wall_time: float | None = None  # seconds since the epoch; None: now
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Table:
    """A small table logged at a step (a few sample episodes of one policy version)."""

    name: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    step: int


class Tracker(ABC):
    """Where a run's figures are sent."""

    @abstractmethod
    def log_scalars(self, scalars: Scalars) -> None:
        """Record ``scalars``."""

    @abstractmethod
    def log_table(self, table: Table) -> None:
        """Record ``table``."""

    @abstractmethod
    def flush(self) -> None:
        """Make everything recorded so far durable (the follower stores its offsets only after this)."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release the tracker."""
