"""The embedded log's consumer groups deal partition numbers, not topic partitions: co-keyed topics meet."""

from __future__ import annotations

from pathlib import Path

from orchard.bus.base import TopicPartition
from orchard.bus.embedded.groups import GroupMembership

TOPICS = ("scores", "trajectories")


def test_three_members_each_own_the_same_partition_numbers_of_every_input_topic(tmp_path: Path) -> None:
    members = [GroupMembership(tmp_path, f"m{i}", session_timeout_ms=60_000) for i in range(3)]
    partitions = [TopicPartition(topic, p) for topic in TOPICS for p in range(8)]
    shares = [member.assignment(partitions) for member in members]
    assert sorted(tp for share in shares for tp in share) == sorted(partitions)  # each partition once
    for share in shares:
        numbers = {tp.partition for tp in share}
        assert share == sorted(TopicPartition(topic, p) for topic in TOPICS for p in numbers)
    assert [sorted({tp.partition for tp in share}) for share in shares] == [[0, 3, 6], [1, 4, 7], [2, 5]]


def test_a_member_that_leaves_hands_its_partition_numbers_to_the_others(tmp_path: Path) -> None:
    members = [GroupMembership(tmp_path, f"m{i}", session_timeout_ms=60_000) for i in range(3)]
    partitions = [TopicPartition(topic, p) for topic in TOPICS for p in range(4)]
    members[1].leave()
    shares = [members[0].assignment(partitions), members[2].assignment(partitions)]
    assert sorted(tp for share in shares for tp in share) == sorted(partitions)
    assert [sorted({tp.partition for tp in share}) for share in shares] == [[0, 2], [1, 3]]
