"""Runs a ``RewardPlugin`` over assembled trajectories and publishes its scores as ``StepScore`` records.

One consumer group per plug-in (``reward-<scorer name>``), so a user's reward runs beside Orchard's own with no
change to Orchard: ``orchard consumer run mypackage.rewards:MyReward``.

Every trajectory with steps gets at least one ``StepScore`` from each scorer: when the plug-in abstains on the
whole episode, a NaN score on its last call (``details_json`` ``{"abstained": true}``) tells the sample builder
this scorer is done with the episode, so it never waits for scores that will not come. Every record of an episode
carries ``episode_score_count``, how many records the scorer published for it (StepScore v2), so the sample builder
knows the moment it has them all. Scores carry the trajectory record's timestamp, so replays are identical. A
plug-in that raises sends the trajectory to the dead letters (with the error) and the stream carries on.

**Group plug-ins** (``needs_groups = True``) see a whole rollout group through ``score_group``. The consumer holds
each trajectory until its group (``consumers.groups``: the same key as the sample builder's) has ``group_size``
members or ``group_timeout_ms`` of event time has passed since it opened, then scores the group and emits each
member's scores, keyed by its episode. Held trajectories (the encoded record as read: its calls stay prefix-delta
encoded, linear in the episode's length), where each came from, the open groups and the clock live in the state
store, so a restart resumes mid-group with nothing lost and nothing scored twice. A member without steps counts
towards the group's size but is not given to the plug-in. A ``score_group`` that raises dead-letters every member
(the letters name the group); a member whose scores are invalid (a call it does not have) is dead-lettered alone.
Event time is the newest input timestamp (stored); ``punctuate`` moves it further to close timed-out groups.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from consumers.config import RewardsConfig
from consumers.groups import ClosedGroup, GroupBuilder, Member, group_key
from consumers.processor import Emit, Input, Processor, RecordRejected, StateStore
from consumers.rewards import RewardPlugin, RewardPluginError, Score, step_score_record
from consumers.samples import SampleBuilderConfig
from orchard.bus.dead_letter import LETTER_OVERHEAD_BYTES
from orchard.codec import Codec
from orchard.episode_groups import stream_key
from orchard.logging import get_logger
from orchard.topics import DEAD_LETTERS, SCORES, TRAJECTORIES
from orchard.trajectory import Trajectory
from orchard.trajectory_records import record_timestamp_ms, trajectory_from_record

log = get_logger("consumers.reward_consumer")
_TRAJ, _SOURCE, _GROUP, _CLOCK = "traj/", "source/", "group/", "clock"
LETTER_LIMIT = 1_000_000
"""Largest dead letter a group failure writes (Kafka's default record limit; the original is cut to fit)."""


@dataclass(frozen=True, slots=True)
class HeldTrajectory:
    """A group member waiting for its group: the trajectory, its encoded record and where that record came from."""

    trajectory: Trajectory
    timestamp_ms: int  # the trajectory record's own timestamp, which its scores carry
    value: bytes
    partition: int
    offset: int
    key: bytes | None


class RewardConsumer(Processor):
    """A reward plug-in as a stream processor: ``trajectories`` in, ``scores`` out, keyed by task (as
    the trajectory)."""

    name: ClassVar[str] = "reward"
    input_topics: ClassVar[tuple[str, ...]] = (TRAJECTORIES,)
    output_topics: ClassVar[tuple[str, ...]] = (SCORES, DEAD_LETTERS)

    def __init__(
        self,
        plugin: RewardPlugin,
        codec: Codec | None = None,
        config: RewardsConfig | None = None,
        sample_builder: SampleBuilderConfig | None = None,
    ) -> None:
        """Score with ``plugin``; the consumer group is ``reward-<scorer name>``. A group plug-in's groups follow
        ``config`` (``consumers.rewards``), whose unset fields come from ``sample_builder``."""
        self.plugin = plugin
        self.scorer = plugin.scorer_name
        self.name = f"reward-{self.scorer}"  # type: ignore[misc]  # per instance: one group per plug-in
        self.codec = codec or Codec.default()
        config, builder = config or RewardsConfig(), sample_builder or SampleBuilderConfig()
        self.group_size = config.group_size or builder.group_size
        self.group_timeout_ms = config.group_timeout_ms
        self.group_by = config.group_by or builder.group_by
        if plugin.needs_groups and self.group_timeout_ms >= builder.score_wait_ms:
            _warn_builder_waits_less(self.scorer, self.group_timeout_ms, builder.score_wait_ms)
        self._state: StateStore | None = None
        self._groups: GroupBuilder | None = None
        self._clock = 0

    # ------------------------------------------------------------------ Processor
    def open(self, state: StateStore) -> None:
        """Rebuild the open groups and the clock from the store (a group plug-in's only state)."""
        self._state = state
        self._groups = GroupBuilder(self.group_size, self.group_timeout_ms, state, prefix=_GROUP)
        self._groups.restore()
        clock = state.get(_CLOCK)
        self._clock = int(clock) if clock is not None else 0

    def process(self, message: Input, emit: Emit) -> None:
        """Score one trajectory (or hold it until its group is complete) and emit what that completed."""
        trajectory = self._trajectory(message.record)
        if self.plugin.needs_groups:
            self._hold(message, trajectory, emit)
        elif trajectory.steps:
            try:
                records = self.episode_records(trajectory, record_timestamp_ms(message.record))
            except Exception as exc:
                raise RecordRejected(f"reward plug-in {self.scorer!r} failed: {exc}", type(exc).__name__) from exc
            for record in records:
                emit(SCORES, "StepScore", record, stream_key(trajectory.task_id))

    def punctuate(self, now_ms: int, emit: Emit) -> None:
        """Score the groups that timed out by ``now_ms`` (not stored: only inputs move the clock)."""
        if self.plugin.needs_groups:
            self._expire(max(self._clock, now_ms), emit)

    # ------------------------------------------------------------------ one episode
    def _trajectory(self, record: Mapping[str, Any]) -> Trajectory:
        try:
            return trajectory_from_record(record, self.codec)
        except Exception as exc:
            raise RecordRejected(f"cannot rebuild the trajectory: {exc}", type(exc).__name__) from exc

    def episode_records(self, trajectory: Trajectory, timestamp_ms: int) -> list[dict[str, Any]]:
        """The ``StepScore`` records a per-episode plug-in gives a trajectory with steps, stamped ``timestamp_ms``."""
        return self._records(trajectory, self.plugin.score_episode(trajectory), timestamp_ms)

    def _records(self, trajectory: Trajectory, scores: Sequence[Score], timestamp_ms: int) -> list[dict[str, Any]]:
        """The episode's ``StepScore`` records (a NaN abstention if there are no scores), each with their count."""
        if not scores:
            scores = [Score(trajectory.steps[-1].call_index, math.nan, details={"abstained": True})]
        return [
            step_score_record(trajectory, score, self.scorer, timestamp_ms, episode_score_count=len(scores))
            for score in scores
        ]

    # ------------------------------------------------------------------ groups
    def _hold(self, message: Input, trajectory: Trajectory, emit: Emit) -> None:
        state = self._store()
        if message.timestamp_ms > self._clock:
            self._expire(message.timestamp_ms - 1, emit)  # groups that timed out before this input came first
            self._clock = message.timestamp_ms
            state.put(_CLOCK, str(self._clock).encode())
        episode = trajectory.episode_id
        if trajectory.steps and state.get(_TRAJ + episode) is None:
            value = message.value or self.codec.encode("Trajectory", message.record)
            source = {"partition": message.partition, "offset": message.offset, "key": _text(message.key)}
            state.put(_TRAJ + episode, value)
            state.put(_SOURCE + episode, json.dumps(source).encode())
        closed = self._open_groups().add(group_key(trajectory, self.group_by), Member(episode, self._clock))
        if closed is not None:
            self._score_group(closed, emit)
        self._expire(self._clock, emit)

    def _expire(self, now_ms: int, emit: Emit) -> None:
        for group in self._open_groups().expire(now_ms):
            self._score_group(group, emit)

    def _score_group(self, group: ClosedGroup, emit: Emit) -> None:
        held = [h for h in (self._release(m.episode_id) for m in group.members) if h is not None]
        if not held:
            return
        try:
            results = self.plugin.score_group([h.trajectory for h in held])
            unknown = sorted(set(results) - {h.trajectory.episode_id for h in held})
            if unknown:
                raise RewardPluginError(f"score_group returned scores for episodes not in the group: {unknown}")
        except Exception as exc:
            reason = f"reward plug-in {self.scorer!r} failed on rollout group {group.key} ({len(held)} members): {exc}"
            for member in held:
                emit(DEAD_LETTERS, "DeadLetter", self._letter(member, reason, exc, group.closed_ms), member.key)
            return
        for member in held:
            self._emit_member(member, results.get(member.trajectory.episode_id, []), group.closed_ms, emit)
        log.info("group scored", scorer=self.scorer, group=group.key, reason=group.reason, size=len(held))

    def _emit_member(self, member: HeldTrajectory, scores: Sequence[Score], closed_ms: int, emit: Emit) -> None:
        trajectory = member.trajectory
        try:
            records = self._records(trajectory, list(scores), member.timestamp_ms)
        except Exception as exc:
            reason = f"reward plug-in {self.scorer!r} failed: {exc}"
            emit(DEAD_LETTERS, "DeadLetter", self._letter(member, reason, exc, closed_ms), member.key)
            return
        for record in records:
            emit(SCORES, "StepScore", record, stream_key(trajectory.task_id))

    def _release(self, episode: str) -> HeldTrajectory | None:
        """Take a member's trajectory out of the store (None for a member without steps: nothing was held)."""
        state = self._store()
        value, source = state.get(_TRAJ + episode), state.get(_SOURCE + episode)
        if value is None or source is None:
            return None
        state.delete(_TRAJ + episode)
        state.delete(_SOURCE + episode)
        record = self.codec.decode(value).record
        where = json.loads(source)
        key = None if where["key"] is None else where["key"].encode("latin-1")
        timestamp = record_timestamp_ms(record)
        trajectory = trajectory_from_record(record, self.codec)
        return HeldTrajectory(trajectory, timestamp, value, where["partition"], where["offset"], key)

    def _letter(self, member: HeldTrajectory, reason: str, exc: Exception, at_ms: int) -> dict[str, Any]:
        """The ``DeadLetter`` of a held trajectory the plug-in failed on (the runtime's letters, for a group)."""
        room = LETTER_LIMIT - LETTER_OVERHEAD_BYTES - len(reason)
        original = member.value
        if len(original) > room:
            reason = f"{reason} [original cut from {len(original)} to {max(room, 0)} bytes to fit the letter]"
            original = original[: max(room, 0)]
        log.warning("dead-lettered a group member", scorer=self.scorer, episode_id=member.trajectory.episode_id,
                    error_type=type(exc).__name__, reason=reason[:200])  # fmt: skip
        return {
            "original": original, "source_topic": TRAJECTORIES, "source_partition": member.partition,
            "source_offset": member.offset, "source_key": member.key, "reason": reason,
            "error_type": type(exc).__name__, "consumer_group": self.name, "timestamp": at_ms,
        }  # fmt: skip

    def _store(self) -> StateStore:
        if self._state is None:
            raise RuntimeError("RewardConsumer.open(state) must be called before a group plug-in runs")
        return self._state

    def _open_groups(self) -> GroupBuilder:
        if self._groups is None:
            raise RuntimeError("RewardConsumer.open(state) must be called before a group plug-in runs")
        return self._groups


def _warn_builder_waits_less(scorer: str, group_timeout_ms: int, score_wait_ms: int) -> None:
    log.warning(
        "group timeout not below the sample builder's score_wait_ms: the members of a group that times out may be "
        "trained on before its scores come", scorer=scorer, group_timeout_ms=group_timeout_ms,
        score_wait_ms=score_wait_ms,
    )  # fmt: skip


def _text(key: bytes | None) -> str | None:
    """A record key as JSON-safe text (latin-1 maps every byte to one character and back)."""
    return None if key is None else key.decode("latin-1")
