"""The in-memory index of a run's episodes: each episode's records as read from the bus, and its summary row.

Records are kept encoded (as read) and decoded again only when an episode is opened, so the index costs about the
bus's own size in memory; only outcomes (small) are kept decoded, since every list request filters on them. Model
calls are deduplicated by call index, samples by sample id (a replayed consumer may publish one twice). An episode
is listed once it has an outcome, a model call or a trajectory; scores or samples alone do not make one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchard.bus import Record
from orchard.codec import Codec
from orchard.episode_groups import is_eval_group
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.viewer.runfiles import Stage, stage_at
from orchard.viewer.values import finite, ms

log = get_logger("orchard.viewer.index")

NO_OUTCOME = "NO_OUTCOME"  # the status filter's name for episodes whose outcome has not arrived


@dataclass
class EpisodeRecords:
    """What the bus holds of one episode."""

    episode_id: str
    run_id: str = ""
    task_id: str = ""
    outcome: dict[str, Any] | None = None  # decoded EpisodeOutcome (from ``outcomes``, else the trajectory's)
    calls: dict[int, bytes] = field(default_factory=dict)  # call index -> encoded ModelCall
    call_versions: set[int] = field(default_factory=set)
    last_call_ms: int | None = None
    trajectory: bytes | None = None  # encoded Trajectory
    trajectory_calls: int = 0
    trajectory_complete: bool | None = None
    samples: dict[str, bytes] = field(default_factory=dict)  # sample id -> encoded TrainingSample
    scores: list[bytes] = field(default_factory=list)  # encoded StepScore

    @property
    def listed(self) -> bool:
        """Whether the episode is shown in the list."""
        return self.outcome is not None or bool(self.calls) or self.trajectory is not None

    def summary(self, stages: list[Stage]) -> dict[str, Any]:
        """The episode's row in the list."""
        outcome = self.outcome or {}
        version = outcome.get("policy_version")
        if version is None and self.call_versions:
            version = max(self.call_versions)
        ended = ms(outcome.get("ended_at")) or self.last_call_ms
        group = str(outcome.get("group_id", ""))
        return {
            "episode_id": self.episode_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "group_id": group,
            "status": outcome.get("status", NO_OUTCOME),
            "reward": finite(outcome.get("reward")),
            "success": outcome.get("success"),
            "policy_version": version,
            "started_ms": ms(outcome.get("started_at")),
            "ended_ms": ended,
            "stage": stage_at(stages, ended),
            "eval": is_eval_group(group),
            "model_calls": max(len(self.calls), self.trajectory_calls),
            "complete": self.trajectory_complete,
            "samples": len(self.samples),
            "scores": len(self.scores),
        }


class EpisodeIndex:
    """Episodes by id, fed decoded-on-arrival records; ``undecodable`` counts records no schema could read."""

    def __init__(self, codec: Codec | None = None) -> None:
        self.codec = codec or Codec.default()
        self.episodes: dict[str, EpisodeRecords] = {}
        self.undecodable: dict[str, int] = {}

    def add_all(self, records: Iterable[Record]) -> int:
        """Index ``records``; return how many were indexed."""
        added = 0
        for record in records:
            added += self.add(record)
        return added

    def add(self, record: Record) -> bool:
        """Index one record of the ``outcomes``, ``model-calls``, ``trajectories``, ``samples`` or ``scores`` topic
        (by its schema, whatever the topic); False for a record it skipped."""
        try:
            decoded = self.codec.decode(record.value)
        except SerializationError as exc:
            count = self.undecodable[record.topic] = self.undecodable.get(record.topic, 0) + 1
            if count == 1:
                log.warning("undecodable record", topic=record.topic, offset=record.offset, error=str(exc))
            return False
        adder = _ADDERS.get(decoded.name)
        if adder is None:
            return False
        adder(self, decoded.record, record.value)
        return True

    def episode(self, record: Mapping[str, Any]) -> EpisodeRecords:
        """The entry of the record's episode (created on first sight), its run and task filled in when known."""
        entry = self.episodes.get(record["episode_id"])
        if entry is None:
            entry = self.episodes[record["episode_id"]] = EpisodeRecords(record["episode_id"])
        entry.run_id = entry.run_id or str(record.get("run_id", ""))
        entry.task_id = entry.task_id or str(record.get("task_id", ""))
        return entry

    def _add_call(self, record: dict[str, Any], value: bytes) -> None:
        entry = self.episode(record)
        entry.calls.setdefault(int(record["call_index"]), value)
        entry.call_versions.add(int(record["policy_version"]))
        when = ms(record.get("timestamp"))
        if when is not None:
            entry.last_call_ms = max(entry.last_call_ms or when, when)

    def _add_outcome(self, record: dict[str, Any], value: bytes) -> None:
        self.episode(record).outcome = record

    def _add_trajectory(self, record: dict[str, Any], value: bytes) -> None:
        entry = self.episode(record)
        entry.trajectory, entry.trajectory_calls = value, len(record["calls"])
        entry.trajectory_complete = bool(record["complete"])
        if entry.outcome is None and record.get("outcome") is not None:
            try:
                entry.outcome = self.codec.decode(record["outcome"]).record
            except SerializationError as exc:
                log.warning("undecodable nested outcome", episode_id=entry.episode_id, error=str(exc))

    def _add_sample(self, record: dict[str, Any], value: bytes) -> None:
        self.episode(record).samples.setdefault(str(record["sample_id"]), value)

    def _add_score(self, record: dict[str, Any], value: bytes) -> None:
        self.episode(record).scores.append(value)


_ADDERS = {
    "ModelCall": EpisodeIndex._add_call,
    "EpisodeOutcome": EpisodeIndex._add_outcome,
    "Trajectory": EpisodeIndex._add_trajectory,
    "TrainingSample": EpisodeIndex._add_sample,
    "StepScore": EpisodeIndex._add_score,
}
