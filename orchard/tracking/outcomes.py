"""Training throughput from the ``outcomes`` topic: per policy version, how many episodes ended, how fast, how many
succeeded, their mean reward, and a few of them as a table.

Departures from a plain per-episode feed, and why:
- only this run's training episodes count: held-out evaluation episodes (group ``eval-...``) have their figures in
  ``results.json``, and episodes without a policy version (demonstrations, an expert's) have no version to key by;
- a version's figures are logged once, when it is closed: when an episode of a newer version has ended, or when the
  run is over. Logging a running tally would write the same step again at every pass. An episode of a closed version
  that ends later (a straggler of an asynchronous rollout) is counted in ``outcomes/late_episodes``, not re-logged;
- ``episodes_per_s`` is the version's episodes over the time from its first to its last ``ended_at`` (the bus
  timestamp when an outcome has none); a version with one episode, or all at one instant, has none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from orchard.bus import Consumer, Record, TopicPartition, open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.episode_groups import EVAL_GROUP_PREFIX
from orchard.logging import get_logger
from orchard.serialization_errors import SerializationError
from orchard.topics import OUTCOMES
from orchard.tracking.base import Scalars, Table

log = get_logger("orchard.tracking.outcomes")

SAMPLE_COLUMNS = ("episode_id", "task_id", "status", "reward", "success")
MAX_POLL_ROUNDS = 100  # per pass: at most this many polls of up to 1000 records, so a pass always ends


@dataclass
class VersionTally:
    """The training episodes of one policy version seen so far."""

    episodes: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    first_ms: int | None = None
    last_ms: int | None = None
    samples: list[list[Any]] = field(default_factory=list)

    def add(self, outcome: dict[str, Any], ended_ms: int, sample_limit: int) -> None:
        """Count one episode (and keep it as a sample while there are fewer than ``sample_limit``)."""
        self.episodes += 1
        self.successes += bool(outcome["success"])
        self.reward_sum += float(outcome["reward"])
        self.first_ms = ended_ms if self.first_ms is None else min(self.first_ms, ended_ms)
        self.last_ms = ended_ms if self.last_ms is None else max(self.last_ms, ended_ms)
        if len(self.samples) < sample_limit:
            self.samples.append([outcome[column] for column in SAMPLE_COLUMNS])

    def scalars(self, version: int) -> Scalars:
        """The version's figures under ``outcomes/`` at step ``version``."""
        values = {"outcomes/episodes": float(self.episodes), "outcomes/success_rate": self.successes / self.episodes,
                  "outcomes/mean_reward": self.reward_sum / self.episodes}  # fmt: skip
        span_s = ((self.last_ms or 0) - (self.first_ms or 0)) / 1000
        if span_s > 0:
            values["outcomes/episodes_per_s"] = self.episodes / span_s
        wall_time = self.last_ms / 1000 if self.last_ms is not None else None
        return Scalars(values, version, wall_time, {"policy_version": str(version)})

    def table(self, version: int) -> Table:
        """The version's sample episodes."""
        return Table("samples/episodes", SAMPLE_COLUMNS, self.samples, version)

    def public(self) -> dict[str, Any]:
        """The tally as JSON (kept in the follower's state)."""
        return asdict(self)


def training_outcome(fields: dict[str, Any], run_id: str) -> bool:
    """Whether a decoded outcome is a versioned training episode of ``run_id``."""
    return (fields.get("run_id") == run_id and fields.get("policy_version") is not None
            and not str(fields.get("group_id", "")).startswith(EVAL_GROUP_PREFIX))  # fmt: skip


class OutcomeReader:
    """Reads the outcomes topic from stored offsets (no consumer group: it commits nothing on the bus)."""

    def __init__(self, bus: BusConfig, offsets: dict[str, int]) -> None:
        self._bus_config = bus
        self.offsets = dict(offsets)  # partition (as a string, for JSON) -> next offset to read
        self._codec = Codec.default()
        self._bus = open_bus(bus)
        self._consumer: Consumer | None = None

    def read(self) -> list[tuple[dict[str, Any], int]]:
        """The outcomes published since the last read, decoded, each with its ``ended_at`` in milliseconds."""
        if self._consumer is None and not self._open():
            return []
        assert self._consumer is not None  # noqa: S101 - opened above
        records = read_until_quiet(
            self._consumer, max_records=1000, poll_timeout_s=0.2, idle_polls=1, max_polls=MAX_POLL_ROUNDS
        )
        return [decoded for record in records if (decoded := self._take(record)) is not None]

    def close(self) -> None:
        """Release the consumer and the bus."""
        if self._consumer is not None:
            self._consumer.close()
        self._bus.close()

    def _open(self) -> bool:
        if OUTCOMES not in self._bus.list_topics():
            return False
        self._consumer = self._bus.consumer([OUTCOMES], start="earliest")
        for partition, offset in self.offsets.items():
            self._consumer.seek(TopicPartition(OUTCOMES, int(partition)), offset)
        return True

    def _take(self, record: Record) -> tuple[dict[str, Any], int] | None:
        if record.offset < self.offsets.get(str(record.partition), 0):
            return None  # read before (a backend that could not seek yet)
        self.offsets[str(record.partition)] = record.offset + 1
        try:
            fields = self._codec.decode(record.value).record
        except SerializationError as exc:
            log.warning("undecodable outcome skipped", partition=record.partition, offset=record.offset,
                        error=str(exc))  # fmt: skip
            return None
        return fields, ended_ms(fields.get("ended_at"), record.timestamp_ms)


def ended_ms(ended: Any, fallback_ms: int) -> int:
    """An outcome's ``ended_at`` (a ``datetime`` as decoded, or milliseconds) in milliseconds; else ``fallback_ms``.

    >>> from datetime import timezone
    >>> ended_ms(datetime(2023, 11, 14, 22, 13, 21, tzinfo=timezone.utc), 0), ended_ms(5, 0), ended_ms(None, 7)
    (1700000001000, 5, 7)
    """
    if isinstance(ended, datetime):
        return int(ended.timestamp() * 1000)
    return int(ended) if isinstance(ended, int) else fallback_ms
