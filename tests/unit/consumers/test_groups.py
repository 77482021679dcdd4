"""Rollout groups: keyed by group id (or task and policy version), closed when full or on an event-time timeout,
and resumed exactly from the state store."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from consumers.groups import ClosedGroup, GroupBuilder, Member, group_key
from orchard.trajectory import Step, Trajectory


class DictStore:
    """A plain dict as the ``StateStore`` (pure-logic tests only)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self.data.items()))


def _trajectory(group_id: str, versions: tuple[int, ...] = (3, 4)) -> Trajectory:
    steps = tuple(
        Step(
            call_index=i,
            conversation_id=0,
            policy_version=v,
            prompt_token_ids=np.zeros(1, dtype=np.int32),
            completion_token_ids=np.zeros(1, dtype=np.int32),
            completion_logprobs=np.zeros(1, dtype=np.float32),
            request_messages=[],
            response_text="",
            response_tool_calls=[],
            finish_reason="stop",
        )  # fmt: skip
        for i, v in enumerate(versions)
    )
    return Trajectory(run_id="run", episode_id="e", task_id="task", group_id=group_id, steps=steps)


def test_group_keys_use_the_group_id_when_set_else_task_and_oldest_policy_version() -> None:
    assert group_key(_trajectory("g1")) == "run/group/g1"
    assert group_key(_trajectory("")) == "run/task/task/v3"
    assert group_key(_trajectory("g1"), "task_version") == "run/task/task/v3"


def test_a_group_closes_when_full_with_its_members_in_arrival_order() -> None:
    store = DictStore()
    groups = GroupBuilder(size=3, timeout_ms=1000, state=store)
    assert groups.add("a", Member("e1", 10)) is None
    assert groups.add("b", Member("x1", 11)) is None
    assert groups.add("a", Member("e2", 12)) is None
    assert groups.add("a", Member("e2", 13)) is None  # a duplicate delivery is not a second member
    assert set(store.data) == {"group/a", "group/b"}
    closed = groups.add("a", Member("e3", 14))
    assert closed == ClosedGroup("a", 10, 14, (Member("e1", 10), Member("e2", 12), Member("e3", 14)), "full")
    assert set(store.data) == {"group/b"}
    assert groups.add("a", Member("e4", 20)) is None  # the next trajectory of that key opens a new group
    assert dict(groups.open_groups()) == {"b": (Member("x1", 11),), "a": (Member("e4", 20),)}


def test_a_group_closes_on_its_event_time_timeout_not_before() -> None:
    store = DictStore()
    groups = GroupBuilder(size=4, timeout_ms=100, state=store)
    groups.add("a", Member("e1", 1000))
    groups.add("b", Member("x1", 1050))
    groups.add("a", Member("e2", 1090))
    assert groups.next_deadline() == 1100
    assert groups.expire(1099) == []
    assert groups.expire(1100) == [ClosedGroup("a", 1000, 1100, (Member("e1", 1000), Member("e2", 1090)), "timeout")]
    assert groups.next_deadline() == 1150
    assert [group.key for group in groups.expire(10_000)] == ["b"]
    assert groups.next_deadline() is None and store.data == {}


def test_a_full_group_leaves_no_stale_timeout_behind() -> None:
    groups = GroupBuilder(size=1, timeout_ms=100, state=DictStore())
    assert groups.add("a", Member("e1", 0)) is not None
    assert groups.next_deadline() is None
    assert groups.expire(1000) == []


def test_a_restarted_builder_resumes_its_open_groups_from_the_store() -> None:
    store = DictStore()
    first = GroupBuilder(size=3, timeout_ms=100, state=store)
    first.add("a", Member("e1", 0))
    first.add("a", Member("e2", 5))
    first.add("b", Member("x1", 50))
    second = GroupBuilder(size=3, timeout_ms=100, state=store)
    second.restore()
    assert second.add("a", Member("e3", 7)) == ClosedGroup(
        "a", 0, 7, (Member("e1", 0), Member("e2", 5), Member("e3", 7)), "full"
    )
    assert [(g.key, g.closed_ms) for g in second.expire(150)] == [("b", 150)]


@pytest.mark.parametrize(("size", "timeout"), [(0, 10), (2, -1)])
def test_bad_sizes_and_timeouts_are_refused(size: int, timeout: int) -> None:
    with pytest.raises(ValueError, match="group (size|timeout)"):
        GroupBuilder(size=size, timeout_ms=timeout, state=DictStore())
