"""Consumer groups of the embedded bus: committed offsets and a membership that shares out partitions.

Members announce themselves with a heartbeat file (its mtime); every live member computes the same
assignment from the sorted member list, so no coordinator process is needed. A member silent for longer
than the session timeout loses its share; a static member (``instance_id``) that restarts takes its slot back
at once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from orchard.bus.base import TopicPartition
from orchard.bus.embedded.locks import file_lock, write_atomic


def _key(tp: TopicPartition) -> str:
    return f"{tp.topic}/{tp.partition}"


class GroupOffsets:
    """Committed offsets of one group, in ``offsets.json`` replaced atomically under the group lock."""

    def __init__(self, directory: Path, *, fsync: bool) -> None:
        self.directory = directory
        self.fsync = fsync
        directory.mkdir(parents=True, exist_ok=True)
        self.lock_path = directory / "lock"
        self._path = directory / "offsets.json"

    def read(self) -> dict[TopicPartition, int]:
        """All committed offsets of the group."""
        try:
            raw: dict[str, int] = json.loads(self._path.read_bytes())
        except FileNotFoundError:
            return {}
        out: dict[TopicPartition, int] = {}
        for key, offset in raw.items():
            topic, _, partition = key.rpartition("/")
            out[TopicPartition(topic, int(partition))] = offset
        return out

    def commit(self, offsets: dict[TopicPartition, int], *, only_forward: bool = False) -> None:
        """Store ``offsets``; with ``only_forward`` an offset never moves back (settling an old transaction)."""
        with file_lock(self.lock_path):
            self.commit_locked(offsets, only_forward=only_forward)

    def commit_locked(self, offsets: dict[TopicPartition, int], *, only_forward: bool = False) -> None:
        """``commit`` for a caller holding the group lock."""
        current = self.read()
        for tp, offset in offsets.items():
            if only_forward and current.get(tp, -1) >= offset:
                continue
            current[tp] = offset
        payload = json.dumps({_key(tp): off for tp, off in sorted(current.items())}, sort_keys=True).encode()
        write_atomic(self._path, payload, fsync=self.fsync)


class GroupMembership:
    """This process's membership in a group, and the partitions it owns."""

    def __init__(self, directory: Path, member_id: str, session_timeout_ms: int) -> None:
        self.members_dir = directory / "members"
        self.members_dir.mkdir(parents=True, exist_ok=True)
        self.member_id = member_id
        self.session_timeout_s = session_timeout_ms / 1000
        self._heartbeat_path = self.members_dir / member_id
        self._last_beat = 0.0
        self.heartbeat(force=True)

    def heartbeat(self, *, force: bool = False) -> None:
        """Refresh this member's liveness (at most a few times per session timeout)."""
        now = time.monotonic()
        if force or now - self._last_beat > self.session_timeout_s / 4:
            self._heartbeat_path.touch()
            self._last_beat = now

    def live_members(self) -> list[str]:
        """Members whose heartbeat is recent, sorted."""
        cutoff = time.time() - self.session_timeout_s
        live = []
        for entry in os.scandir(self.members_dir):
            try:
                if entry.stat().st_mtime >= cutoff or entry.name == self.member_id:
                    live.append(entry.name)
            except FileNotFoundError:
                continue
        return sorted(live)

    def assignment(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """This member's share: partition numbers dealt round-robin over the sorted live members, each number with
        every topic's partition of that number. Topics with the same partition count are thus co-partitioned, as
        Kafka's range assignor makes them: records of one key in two topics (a trajectory and its scores) reach
        the same member."""
        members = self.live_members()
        me = members.index(self.member_id)
        numbers = sorted({tp.partition for tp in partitions})
        mine = {number for i, number in enumerate(numbers) if i % len(members) == me}
        return [tp for tp in sorted(partitions) if tp.partition in mine]

    def leave(self) -> None:
        """Remove this member so the others take over its partitions at once."""
        self._heartbeat_path.unlink(missing_ok=True)
