"""``EmbeddedConsumer``: reads partition logs; in a group it shares partitions with the group's other live members
(heartbeat files, ``groups``) and commits to the group's offsets file."""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

from orchard.bus.base import Consumer, Record, StartPosition, TopicPartition
from orchard.bus.embedded import wakeup
from orchard.bus.embedded.groups import GroupMembership, GroupOffsets
from orchard.bus.exceptions import BusError, ConsumerClosedError, TransactionError
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.bus.embedded.backend import EmbeddedBus

POLL_SLEEP_S = 0.01
REBALANCE_INTERVAL_S = 0.2

log = get_logger("bus.embedded")


class EmbeddedConsumer(Consumer):
    """Reads partition logs; in a group it shares partitions with the group's other live members."""

    def __init__(
        self,
        bus: EmbeddedBus,
        topics: list[str],
        group: str | None,
        *,
        start: StartPosition,
        instance_id: str | None,
    ) -> None:
        self.bus = bus
        self.topics = topics
        self.group = group
        self.start = start
        self._positions: dict[TopicPartition, int] = {}
        self._pending_seeks: dict[TopicPartition, int] = {}
        self._next_rebalance = 0.0
        self._cursor = 0
        self._closed = False
        self._membership: GroupMembership | None = None
        self._offsets: GroupOffsets | None = None
        if group is not None:
            member = instance_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self._offsets = bus.group_offsets(group)
            self._membership = GroupMembership(bus.root / "groups" / group, member, bus.config.session_timeout_ms)
        self._rebalance(force=True)

    def _all_partitions(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in self.topics for p in range(self.bus.partitions(t))]

    def _rebalance(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next_rebalance:
            return
        self._next_rebalance = now + REBALANCE_INTERVAL_S
        partitions = self._all_partitions()
        if self._membership is not None:
            self._membership.heartbeat()
            partitions = self._membership.assignment(partitions)
        wanted = set(partitions)
        for tp in list(self._positions):
            if tp not in wanted:
                del self._positions[tp]
        new = [tp for tp in partitions if tp not in self._positions]
        committed = self._offsets.read() if (new and self._offsets is not None) else {}
        for tp in new:
            self._positions[tp] = self._initial_position(tp, committed)

    def _initial_position(self, tp: TopicPartition, committed: dict[TopicPartition, int]) -> int:
        if tp in self._pending_seeks:
            return self._pending_seeks.pop(tp)
        if tp in committed:
            return committed[tp]
        partition_log = self.bus.log_for(tp)
        if self.start == "earliest":
            return partition_log.start_offset()
        if self.start == "latest":
            return partition_log.end_offset()
        return partition_log.offset_for_timestamp(self.start)

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumerClosedError("consumer is closed")

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Record]:
        """Read up to ``max_records`` from the assigned partitions, taking them in turn."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            seen = wakeup.generation()  # before the look, so an append during it is not slept through
            self._rebalance()
            out = self._read_round(max_records)
            now = time.monotonic()
            if out or now >= deadline:
                return out
            # an append in this process wakes it at once; another process's is seen within POLL_SLEEP_S
            wakeup.wait(seen, min(POLL_SLEEP_S, deadline - now))

    def _read_round(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        tps = list(self._positions)
        for i in range(len(tps)):
            if len(out) >= max_records:
                break
            tp = tps[(self._cursor + i) % len(tps)]
            partition_log = self.bus.log_for(tp)
            position = self._positions[tp]
            start = partition_log.start_offset()
            if position < start:  # retention deleted what we had not read yet
                log.warning("offset out of range, skipping to log start", topic=tp.topic, partition=tp.partition)
                position = start
            batch = partition_log.read(position, max_records - len(out))
            if batch:
                out.extend(Record(tp.topic, tp.partition, r.offset, r.timestamp_ms, r.key, r.value) for r in batch)
                self._positions[tp] = batch[-1].offset + 1
        self._cursor += 1
        return out

    def commit(self) -> None:
        """Commit the positions of the partitions this member still owns (a lost one is its new owner's)."""
        self._check_open()
        if self._offsets is None:
            raise BusError("commit needs a consumer group")
        self._rebalance(force=True)
        self._offsets.commit(dict(self._positions))

    def ensure_owner(self) -> None:
        """Raise ``TransactionError`` if another member has taken any of this consumer's partitions."""
        if self._membership is None:
            return
        self._membership.heartbeat(force=True)
        owned = set(self._membership.assignment(self._all_partitions()))
        lost = sorted(set(self._positions) - owned)
        if lost:
            raise TransactionError(f"partitions {lost} were reassigned to another member; transaction aborted")

    def rewind_to_committed(self) -> None:
        """Forget uncommitted progress: every partition goes back to its committed (or initial) offset."""
        self._positions = {}
        self._rebalance(force=True)

    def position(self) -> dict[TopicPartition, int]:
        """Next offsets to read."""
        return dict(self._positions)

    def committed(self, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """Committed offsets of the assigned partitions (read from disk at once: ``timeout_s`` has nothing to
        bound)."""
        if self._offsets is None:
            return {}
        stored = self._offsets.read()
        return {tp: stored[tp] for tp in self._positions if tp in stored}

    def assignment(self) -> list[TopicPartition]:
        """Assigned partitions, sorted."""
        self._rebalance()
        return sorted(self._positions)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next."""
        if tp in self._positions:
            self._positions[tp] = offset
        else:
            self._pending_seeks[tp] = offset

    def seek_to_timestamp(self, timestamp_ms: int) -> dict[TopicPartition, int]:
        """Seek each assigned partition to its first record at or after ``timestamp_ms``."""
        for tp in self._positions:
            self._positions[tp] = self.bus.log_for(tp).offset_for_timestamp(timestamp_ms)
        return dict(self._positions)

    def close(self) -> None:
        """Leave the group."""
        if not self._closed and self._membership is not None:
            self._membership.leave()
        self._closed = True
