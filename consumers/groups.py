"""Rollout groups: the trajectories whose rewards are compared with each other (GRPO-style advantages).

Which trajectories form a group (``group_key``):

- ``by="auto"`` (default): trajectories with the same ``group_id``, when the outcome carries one. Orchard Env gives
  every episode it starts as part of a rollout group that group's id (same task, started together, sized by
  Balanced Adaptive Rollout), which is exactly the set a group-relative baseline should be computed over; grouping
  by task alone would mix rollouts started at different times under different policies.
- otherwise (no ``group_id``, or ``by="task_version"``): trajectories of the same task and the same policy version
  (the oldest version among the episode's calls, the one staleness limits use): the comparison is fair only
  between attempts of the same policy at the same task.

Keys always include the run id: runs never share a group.

When a group closes: when it has ``size`` members, or ``timeout_ms`` of event time after its first member joined
(whichever comes first). Event time is what the caller passes (record timestamps, or the runtime's ``now`` in
``punctuate``), never the wall clock read here. A trajectory arriving for a key whose group has closed opens a new
group under the same key. Members are kept in arrival order.

State: every open group is one key (``<prefix><group key>``) in the ``StateStore``, a small JSON value, written on
each change; ``restore`` rebuilds the in-memory index from the store, so a restarted builder resumes exactly.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from consumers.processor import StateStore
from orchard.trajectory import Trajectory

GroupBy = Literal["auto", "task_version"]


def group_key(trajectory: Trajectory, by: GroupBy = "auto") -> str:
    """The key of the group ``trajectory`` belongs to (see the module docstring)."""
    if by == "auto" and trajectory.group_id:
        return f"{trajectory.run_id}/group/{trajectory.group_id}"
    return f"{trajectory.run_id}/task/{trajectory.task_id}/v{trajectory.oldest_policy_version}"


@dataclass(frozen=True, slots=True)
class Member:
    """One trajectory in a group: its episode id and the event time it joined. An ``empty`` member is an episode of
    the group that is not trained on (crashed, incomplete, without calls): it counts towards the group's size, so the
    group closes once every episode started with it has arrived, but has no reward and no samples."""

    episode_id: str
    joined_ms: int
    empty: bool = False


@dataclass(frozen=True, slots=True)
class ClosedGroup:
    """A group that closed: its members in arrival order, and why (``full`` or ``timeout``)."""

    key: str
    opened_ms: int
    closed_ms: int  # the last member's join (full) or the deadline (timeout): derived from inputs, not the clock
    members: tuple[Member, ...]
    reason: Literal["full", "timeout"]


@dataclass(slots=True)
class _OpenGroup:
    key: str
    opened_ms: int
    members: list[Member] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        members = [[m.episode_id, m.joined_ms, *([True] if m.empty else [])] for m in self.members]
        return json.dumps({"opened_ms": self.opened_ms, "members": members}).encode()

    @classmethod
    def from_bytes(cls, key: str, data: bytes) -> _OpenGroup:
        value = json.loads(data)
        return cls(key, value["opened_ms"], [Member(*member) for member in value["members"]])


class GroupBuilder:
    """Collects trajectories into groups that close when full or after a timeout (pure logic over a state store)."""

    def __init__(self, size: int, timeout_ms: int, state: StateStore, prefix: str = "group/") -> None:
        """Groups of up to ``size`` members, closed ``timeout_ms`` after they open; state under ``prefix``."""
        if size < 1:
            raise ValueError(f"group size must be at least 1, got {size}")
        if timeout_ms < 0:
            raise ValueError(f"group timeout must be >= 0 ms, got {timeout_ms}")
        self.size, self.timeout_ms, self.prefix = size, timeout_ms, prefix
        self._state = state
        self._open: dict[str, _OpenGroup] = {}
        self._deadlines: list[tuple[int, str]] = []  # (deadline, key); stale entries skipped on pop

    def restore(self) -> None:
        """Rebuild the open groups from the state store (call once, before ``add``)."""
        self._open.clear()
        self._deadlines.clear()
        for store_key, value in self._state.items():
            if store_key.startswith(self.prefix):
                group = _OpenGroup.from_bytes(store_key[len(self.prefix) :], value)
                self._open[group.key] = group
                heapq.heappush(self._deadlines, (group.opened_ms + self.timeout_ms, group.key))

    def add(self, key: str, member: Member) -> ClosedGroup | None:
        """Add ``member`` to the open group under ``key`` (opening one); the group if this filled it."""
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _OpenGroup(key, member.joined_ms)
            heapq.heappush(self._deadlines, (group.opened_ms + self.timeout_ms, key))
        if any(existing.episode_id == member.episode_id for existing in group.members):
            return None  # a duplicate delivery of the same trajectory
        group.members.append(member)
        if len(group.members) >= self.size:
            return self._close(group, "full")
        self._state.put(self.prefix + key, group.to_bytes())
        return None

    def next_deadline(self) -> int | None:
        """The earliest timeout among the open groups, or None when none is open."""
        while self._deadlines:
            deadline, key = self._deadlines[0]
            group = self._open.get(key)
            if group is not None and group.opened_ms + self.timeout_ms == deadline:
                return deadline
            heapq.heappop(self._deadlines)  # that group closed (full) since
        return None

    def expire(self, now_ms: int) -> list[ClosedGroup]:
        """Close every group whose timeout has passed at event time ``now_ms``, oldest deadline first."""
        closed = []
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            deadline, key = heapq.heappop(self._deadlines)
            group = self._open.get(key)
            if group is not None and group.opened_ms + self.timeout_ms == deadline:
                closed.append(self._close(group, "timeout"))
        return closed

    def open_groups(self) -> Iterator[tuple[str, tuple[Member, ...]]]:
        """The open groups' keys and members (for inspection and tests)."""
        for key, group in self._open.items():
            yield key, tuple(group.members)

    def _close(self, group: _OpenGroup, reason: Literal["full", "timeout"]) -> ClosedGroup:
        del self._open[group.key]
        self._state.delete(self.prefix + group.key)
        closed_ms = group.members[-1].joined_ms if reason == "full" else group.opened_ms + self.timeout_ms
        return ClosedGroup(group.key, group.opened_ms, closed_ms, tuple(group.members), reason)
