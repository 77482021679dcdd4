"""The stages of ``orchard run``: which stage runs, which components it may start, and whether it is done.

Stages run one after another. A stage's ``components`` may start only once the stage begins (components no stage
lists may start at once); a stage is done when every condition of its ``until`` holds: components exited 0, a
policy version published, a topic holding enough records of this run, every trajectory of this run since the stage
began scored by the named scorers (``scored_by``), consumer groups done with every record of their topics
(``caught_up``: what a sample builder made of the stage's trajectories is then all on the bus, so the next stage's
trainer can take its samples as complete). The bus conditions are read here, each topic once and
incrementally, without a group, so the supervisor's loop only asks ``done``. Records are counted by reading them,
not from offsets: on a Kafka cluster a topic is shared by every run on it and transaction markers take offsets too,
so only records that name this run (``run_id``) count. Finished stages are recorded in ``state.json``; a resumed run
skips the stages it already completed.

The components a stage starts get its start time in ``$ORCHARD_STAGE_STARTED_MS`` (``stage_env``), so a consumer
group new in that stage can begin there (``orchard consumer run --start stage``) rather than at the beginning of its
topics. A resumed stage keeps the time it first started (``first_started_at`` in ``state.json``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from consumers.start import STAGE_STARTED_ENV
from orchard.bus import Bus, Consumer, Record, TopicPartition, open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.evaluation.engine_wait import wait_until_served
from orchard.logging import get_logger
from orchard.run.config import RunConfig, StageConfig
from orchard.serialization_errors import SerializationError
from orchard.topics import DEAD_LETTERS, POLICY_VERSIONS, SCORES, TRAJECTORIES
from orchard.trajectory_records import decode_calls, resolvable_calls

log = get_logger("run.stages")

StageStatus = Literal["pending", "running", "completed", "failed"]
PROBE_EVERY_S = 0.5
READ_BUDGET_S = 0.25  # reading one condition check may spend; the rest of a long topic is read by the next


@dataclass
class StageState:
    """What is known of one stage."""

    config: StageConfig
    status: StageStatus = "pending"
    started_at: float | None = None
    ended_at: float | None = None
    deadline: float | None = None  # monotonic
    first_started_at: float | None = None  # the first start, kept across resumes (what ``stage_env`` passes on)

    @property
    def since_ms(self) -> int | None:
        """The stage's first start in milliseconds since the epoch (None before it started)."""
        first = self.first_started_at or self.started_at
        return None if first is None else int(first * 1000)

    def public(self) -> dict[str, Any]:
        """The stage as written to ``state.json``."""
        return {**self.config.model_dump(mode="json", exclude_none=True), "status": self.status,
                "started_at": self.started_at, "ended_at": self.ended_at,
                "first_started_at": self.first_started_at}  # fmt: skip


class BusProbe:
    """Reads the run's bus for stage conditions: records of this run on a topic, its newest policy version, and
    which of its trajectories since a stage began are not scored yet."""

    def __init__(self, bus_config: BusConfig, run_id: str) -> None:
        self.bus_config, self.run_id = bus_config, run_id
        self._bus: Bus | None = None
        self._readers: dict[tuple[str, int | None], Consumer] = {}  # (topic, from when; None: the start)
        self._counts: dict[str, int] = {}
        self._last_offsets: dict[TopicPartition, int] = {}  # of the records read from the start of a topic
        self._codec = Codec.default()
        self.newest_version: int | None = None
        self._trajectories: set[str] = set()  # episodes with calls whose trajectory came since ``scored_since``
        self._scored: dict[str, set[str]] = {}  # scorer -> episodes it scored
        self._scored_since: int | None = None
        self._letters: list[tuple[str, int, int]] = []  # (scorer, partition, offset) of dead-lettered trajectories
        self._at: dict[tuple[int, int], str] = {}  # (partition, offset) of a trajectory -> its episode

    def count(self, topic: str) -> int:
        """Records of this run on ``topic`` so far (0 while it does not exist).

        A record counts unless it decodes to a record naming another run. Each call reads on from where the last
        one stopped, for at most ``READ_BUDGET_S``, so a long topic does not stall the supervisor's loop.
        """
        if (topic, None) not in self._readers and topic not in set(self._open().list_topics()):
            return 0
        self._scan(topic)
        return self._counts.get(topic, 0)

    def caught_up(self, group: str) -> bool:
        """Whether consumer group ``group`` has committed past the last record of every partition of the topics it
        has committed on (read to their ends here, so an offset no record took, a transaction marker, is not waited
        for). False while it has committed nothing, or a topic is not read to its end yet."""
        committed = self._open().committed_offsets(group)
        topics = sorted({tp.topic for tp in committed})
        for topic in topics:
            self._scan(topic)
        if not topics or not all(self._caught_up(topic, None) for topic in topics):
            return False
        return all(committed.get(tp, -1) > last for tp, last in self._last_offsets.items() if tp.topic in topics)

    def _scan(self, topic: str) -> None:
        """Read on in ``topic`` from its start: count this run's records and note each partition's last offset."""
        for record in self._read(topic):
            self._last_offsets[record.topic_partition] = record.offset
            try:
                run_id = self._codec.decode(record.value).record.get("run_id")
            except SerializationError:
                run_id = None  # not an Orchard record: it cannot be another run's
            if run_id is None or run_id == self.run_id:
                self._counts[topic] = self._counts.get(topic, 0) + 1

    def policy_version(self) -> int | None:
        """The highest ``PolicyVersion.version`` of this run published so far."""
        if (POLICY_VERSIONS, None) not in self._readers:
            self._open().create_topic(POLICY_VERSIONS, exist_ok=True)
        for record in self._read(POLICY_VERSIONS):
            try:
                decoded = self._codec.decode(record.value)
            except SerializationError:
                continue  # the trainer's dead letters say why; it names no version of this run
            if decoded.name == "PolicyVersion" and decoded.record["run_id"] == self.run_id:
                version = int(decoded.record["version"])
                self.newest_version = max(version, self.newest_version or version)
        return self.newest_version

    def unscored(self, scorers: list[str], since_ms: int) -> list[str] | None:
        """Episodes of this run whose trajectory was published at or after ``since_ms`` and that some of ``scorers``
        has not handled yet; None while a topic is not read to its end (an episode not read yet cannot be said to be
        scored).

        A scorer has handled a trajectory once it published a ``StepScore`` for it (a reward consumer publishes at
        least one, an abstention if nothing else), or once its consumer group (``reward-<scorer>``, as
        ``orchard consumer run`` names it) dead-lettered it. A trajectory the reward consumer skips (no calls it
        can rebuild steps from) is not waited for.
        """
        if self._scored_since != since_ms:  # another stage: start over from its start
            self._trajectories, self._scored, self._scored_since = set(), {}, since_ms
            self._letters, self._at = [], {}
        for topic in (TRAJECTORIES, SCORES, DEAD_LETTERS):
            if (topic, since_ms) not in self._readers:
                self._open().create_topic(topic, exist_ok=True)  # a reader needs its topic
        for source, record in self._decoded_with_source(TRAJECTORIES, since_ms, "Trajectory"):
            self._at[(source.partition, source.offset)] = str(record["episode_id"])
            if self._scorable(record):
                self._trajectories.add(str(record["episode_id"]))
        for _, record in self._decoded_with_source(SCORES, since_ms, "StepScore"):
            self._scored.setdefault(str(record["scorer"]), set()).add(str(record["episode_id"]))
        self._letters += self._dead_lettered(since_ms)
        for scorer, partition, offset in self._letters:  # a letter read before its trajectory counts once it is
            if (partition, offset) in self._at:
                self._scored.setdefault(scorer, set()).add(self._at[(partition, offset)])
        if not all(self._caught_up(topic, since_ms) for topic in (TRAJECTORIES, SCORES, DEAD_LETTERS)):
            return None
        return sorted(e for e in self._trajectories if any(e not in self._scored.get(s, set()) for s in scorers))

    def _scorable(self, record: Mapping[str, Any]) -> bool:
        """Whether the reward consumer scores this trajectory: it has calls, and (if incomplete) some it can use."""
        if not record["calls"] or record["complete"]:
            return bool(record["calls"])
        try:
            return bool(resolvable_calls(decode_calls(record, self._codec)))
        except SerializationError:
            return False  # the reward consumer cannot rebuild it either: it dead-letters it

    def _dead_lettered(self, since_ms: int) -> list[tuple[str, int, int]]:
        """(scorer, partition, offset) of the trajectories reward consumers dead-lettered since ``since_ms``: a
        trajectory is found by where it is, since its key names its task, not its episode, and a letter's copy of
        the record may be cut short."""
        letters = []
        for record in self._read(DEAD_LETTERS, since_ms):
            try:
                letter = self._codec.decode(record.value).record
            except SerializationError:
                continue
            group = str(letter.get("consumer_group", ""))
            if letter.get("source_topic") == TRAJECTORIES and "reward-" in group:
                scorer = group.rsplit("reward-", 1)[1]
                letters.append((scorer, int(letter["source_partition"]), int(letter["source_offset"])))
        return letters

    def close(self) -> None:
        """Close the readers and the bus."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._bus is not None:
            self._bus.close()

    def _decoded_with_source(self, topic: str, since_ms: int, schema: str) -> Iterator[tuple[Record, dict[str, Any]]]:
        """This run's ``schema`` records on ``topic`` not read yet (each with the record it came in), from the first
        one at or after ``since_ms``."""
        for record in self._read(topic, since_ms):
            try:
                decoded = self._codec.decode(record.value)
            except SerializationError:
                continue
            if decoded.name == schema and decoded.record.get("run_id") == self.run_id:
                yield record, decoded.record

    def _decoded(self, topic: str, since_ms: int, schema: str) -> Iterator[dict[str, Any]]:
        """This run's ``schema`` records on ``topic`` not read yet, from the first one at or after ``since_ms``."""
        for _, record in self._decoded_with_source(topic, since_ms, schema):
            yield record

    def _caught_up(self, topic: str, since_ms: int) -> bool:
        """Whether the reader of ``topic`` from ``since_ms`` is at the end of every partition. Exact on both
        backends: a Kafka consumer's position moves past transaction markers, and is its start offset until it
        fetched."""
        positions = self._readers[(topic, since_ms)].position()
        ends = self._open().describe_topic(topic).end_offsets
        return all(positions.get(TopicPartition(topic, p), -1) >= end for p, end in ends.items())

    def _read(self, topic: str, since_ms: int | None = None) -> Iterator[Record]:
        """The records of ``topic`` not read yet (for up to ``READ_BUDGET_S``), from the start or from the first
        record at or after ``since_ms``, without a group."""
        reader = self._readers.get((topic, since_ms))
        if reader is None:
            start = "earliest" if since_ms is None else since_ms
            reader = self._readers[(topic, since_ms)] = self._open().consumer([topic], group=None, start=start)
        yield from read_until_quiet(reader, max_records=100, poll_timeout_s=0.05, idle_polls=1, budget_s=READ_BUDGET_S)

    def _open(self) -> Bus:
        if self._bus is None:
            self._bus = open_bus(self.bus_config)
        return self._bus


def wait_for_newest_policy(engine: str, bus_config: BusConfig, run_id: str, timeout_s: float) -> int | None:
    """Wait until ``engine`` serves the newest policy version of run ``run_id`` on the bus; return the version it
    serves (None: it did not get there within ``timeout_s``). ``orchard eval --wait-for-engine`` runs this."""
    probe = BusProbe(bus_config, run_id)
    try:
        return wait_until_served(engine, probe.policy_version, timeout_s)
    finally:
        probe.close()


class StageRunner:
    """The stage sequence of one run: ``current``, ``may_start``, ``check`` (which begins and ends stages)."""

    def __init__(
        self, config: RunConfig, probe: BusProbe | None, completed: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        self.config, self.probe = config, probe
        self.stages = [StageState(stage) for stage in config.stages]
        for stage in self.stages:  # a resumed run keeps what it finished
            previous = (completed or {}).get(stage.config.name) or {}
            stage.first_started_at = previous.get("first_started_at") or previous.get("started_at")
            if previous.get("status") == "completed":
                stage.status, stage.started_at, stage.ended_at = (
                    "completed",
                    previous.get("started_at"),
                    previous.get("ended_at"),
                )
        self._staged = config.staged()
        self._enabled: set[str] = set()
        self._probed_at = 0.0
        self._waiting: int | None = None  # unscored episodes last logged

    @property
    def current(self) -> StageState | None:
        """The stage running (or about to), None once all are done."""
        return next((s for s in self.stages if s.status in ("pending", "running")), None)

    @property
    def finished(self) -> bool:
        """Whether every stage completed (True for a recipe without stages)."""
        return all(stage.status == "completed" for stage in self.stages)

    def may_start(self, name: str) -> bool:
        """Whether component ``name`` may be started now."""
        return name not in self._staged or name in self._enabled

    def stage_env(self, name: str) -> dict[str, str]:
        """What component ``name``, started now, learns of the running stage that lists it: its first start time
        (``$ORCHARD_STAGE_STARTED_MS``) and its name (``$ORCHARD_STAGE``); nothing outside such a stage."""
        stage = self.current
        if stage is None or stage.status != "running" or name not in stage.config.components:
            return {}
        return {STAGE_STARTED_ENV: str(stage.since_ms), "ORCHARD_STAGE": stage.config.name}

    def check(
        self,
        statuses: Mapping[str, str],
        begin: Callable[[StageConfig], None],
        end: Callable[[StageConfig], None],
    ) -> str | None:
        """Begin the next stage (``begin``) or end the current one (``end``) when its condition holds.

        Returns a failure reason when the current stage ran past its ``timeout_s``, else None.
        """
        stage = self.current
        if stage is None:
            return None
        if stage.status == "pending":
            stage.status, stage.started_at = "running", time.time()
            stage.first_started_at = stage.first_started_at or stage.started_at
            stage.deadline = time.monotonic() + stage.config.timeout_s if stage.config.timeout_s else None
            self._enabled.update(stage.config.components)
            log.info("stage started", stage=stage.config.name, components=stage.config.components)
            begin(stage.config)
            return None
        if self._done(stage, statuses):
            stage.status, stage.ended_at = "completed", time.time()
            log.info("stage completed", stage=stage.config.name, seconds=round(stage.ended_at - stage.started_at, 1))
            end(stage.config)
            return None
        if stage.deadline is not None and time.monotonic() >= stage.deadline:
            stage.status, stage.ended_at = "failed", time.time()
            return f"stage {stage.config.name} not done within {stage.config.timeout_s:g} s"
        return None

    def _done(self, state: StageState, statuses: Mapping[str, str]) -> bool:
        stage = state.config
        if stage.until is None and not self.config.stage_exits(stage):
            return False  # an open-ended stage: it runs until the run is stopped
        if not all(statuses[name] == "exited" for name in self.config.stage_exits(stage)):
            return False
        until = stage.until
        if until is None or not until.reads_bus:
            return True
        if self.probe is None or time.monotonic() - self._probed_at < PROBE_EVERY_S:
            return False
        self._probed_at = time.monotonic()
        try:
            if until.topic is not None and self.probe.count(until.topic) < until.count:
                return False
            if until.policy_version is not None:
                version = self.probe.policy_version()
                if version is None or version < until.policy_version:
                    return False
            if not all(self.probe.caught_up(group) for group in until.caught_up):
                return False
            return not until.scored_by or self._scored(state, until.scored_by)
        except Exception as exc:  # noqa: BLE001 - a bus hiccup delays the stage; it must not end the run
            log.warning("stage condition unreadable", stage=stage.name, error=f"{type(exc).__name__}: {exc}")
            return False

    def _scored(self, state: StageState, scorers: list[str]) -> bool:
        """Whether every trajectory since the stage began has a score of each of ``scorers`` (logged while not)."""
        if self.probe is None or state.since_ms is None:
            return False
        waiting = self.probe.unscored(scorers, state.since_ms)
        if waiting and len(waiting) != self._waiting:
            log.info("stage waiting for scores", stage=state.config.name, scorers=scorers, episodes=len(waiting),
                     first=waiting[:3])  # fmt: skip
        self._waiting = None if waiting is None else len(waiting)
        return waiting == []

    def public(self) -> list[dict[str, Any]]:
        """Every stage as written to ``state.json``."""
        return [stage.public() for stage in self.stages]

    def close(self) -> None:
        """Release the bus probe."""
        if self.probe is not None:
            self.probe.close()
