"""The stages of ``orchard run``: which stage runs, which components it may start, and whether it is done.

Stages run one after another. A stage's ``components`` may start only once the stage begins (components no stage
lists may start at once); a stage is done when every condition of its ``until`` holds: components exited 0, a
policy version published, a topic holding enough records of this run. The bus conditions are read here, each topic
once and incrementally, without a group, so the supervisor's loop only asks ``done``. Records are counted by reading
them, not from offsets: on a Kafka cluster a topic is shared by every run on it and transaction markers take offsets
too, so only records that name this run (``run_id``) count. Finished stages are recorded in ``state.json``; a
resumed run skips the stages it already completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchard.bus import Bus, Consumer, Record, open_bus
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.logging import get_logger
from orchard.run.config import RunConfig, StageConfig
from orchard.serialization_errors import SerializationError
from orchard.topics import POLICY_VERSIONS

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

    def public(self) -> dict[str, Any]:
        """The stage as written to ``state.json``."""
        return {**self.config.model_dump(mode="json", exclude_none=True), "status": self.status,
                "started_at": self.started_at, "ended_at": self.ended_at}  # fmt: skip


class BusProbe:
    """Reads the run's bus for stage conditions: records of this run on a topic, and its newest policy version."""

    def __init__(self, bus_config: BusConfig, run_id: str) -> None:
        self.bus_config, self.run_id = bus_config, run_id
        self._bus: Bus | None = None
        self._readers: dict[str, Consumer] = {}
        self._counts: dict[str, int] = {}
        self._codec = Codec.default()
        self.newest_version: int | None = None

    def count(self, topic: str) -> int:
        """Records of this run on ``topic`` so far (0 while it does not exist).

        A record counts unless it decodes to a record naming another run. Each call reads on from where the last
        one stopped, for at most ``READ_BUDGET_S``, so a long topic does not stall the supervisor's loop.
        """
        if topic not in self._readers and topic not in set(self._open().list_topics()):
            return 0
        for record in self._read(topic):
            try:
                run_id = self._codec.decode(record.value).record.get("run_id")
            except SerializationError:
                run_id = None  # not an Orchard record: it cannot be another run's
            if run_id is None or run_id == self.run_id:
                self._counts[topic] = self._counts.get(topic, 0) + 1
        return self._counts.get(topic, 0)

    def policy_version(self) -> int | None:
        """The highest ``PolicyVersion.version`` of this run published so far."""
        if POLICY_VERSIONS not in self._readers:
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

    def close(self) -> None:
        """Close the readers and the bus."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._bus is not None:
            self._bus.close()

    def _read(self, topic: str) -> Iterator[Record]:
        """The records of ``topic`` not read yet (for up to ``READ_BUDGET_S``), from the start, without a group."""
        reader = self._readers.get(topic)
        if reader is None:
            reader = self._readers[topic] = self._open().consumer([topic], group=None, start="earliest")
        budget_end = time.monotonic() + READ_BUDGET_S
        while time.monotonic() < budget_end and (records := reader.poll(max_records=100, timeout_s=0.05)):
            yield from records

    def _open(self) -> Bus:
        if self._bus is None:
            self._bus = open_bus(self.bus_config)
        return self._bus


class StageRunner:
    """The stage sequence of one run: ``current``, ``may_start``, ``check`` (which begins and ends stages)."""

    def __init__(
        self, config: RunConfig, probe: BusProbe | None, completed: Mapping[str, Mapping[str, Any]] | None = None
    ) -> None:
        self.config, self.probe = config, probe
        self.stages = [StageState(stage) for stage in config.stages]
        for stage in self.stages:  # a resumed run keeps what it finished
            previous = (completed or {}).get(stage.config.name)
            if previous and previous.get("status") == "completed":
                stage.status, stage.started_at, stage.ended_at = (
                    "completed",
                    previous.get("started_at"),
                    previous.get("ended_at"),
                )
        self._staged = config.staged()
        self._enabled: set[str] = set()
        self._probed_at = 0.0

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
            stage.deadline = time.monotonic() + stage.config.timeout_s if stage.config.timeout_s else None
            self._enabled.update(stage.config.components)
            log.info("stage started", stage=stage.config.name, components=stage.config.components)
            begin(stage.config)
            return None
        if self._done(stage.config, statuses):
            stage.status, stage.ended_at = "completed", time.time()
            log.info("stage completed", stage=stage.config.name, seconds=round(stage.ended_at - stage.started_at, 1))
            end(stage.config)
            return None
        if stage.deadline is not None and time.monotonic() >= stage.deadline:
            stage.status, stage.ended_at = "failed", time.time()
            return f"stage {stage.config.name} not done within {stage.config.timeout_s:g} s"
        return None

    def _done(self, stage: StageConfig, statuses: Mapping[str, str]) -> bool:
        if stage.until is None and not self.config.stage_exits(stage):
            return False  # an open-ended stage: it runs until the run is stopped
        if not all(statuses[name] == "exited" for name in self.config.stage_exits(stage)):
            return False
        until = stage.until
        if until is None or (until.policy_version is None and until.topic is None):
            return True
        if self.probe is None or time.monotonic() - self._probed_at < PROBE_EVERY_S:
            return False
        self._probed_at = time.monotonic()
        try:
            if until.topic is not None and self.probe.count(until.topic) < until.count:
                return False
            if until.policy_version is not None:
                version = self.probe.policy_version()
                return version is not None and version >= until.policy_version
        except Exception as exc:  # noqa: BLE001 - a bus hiccup delays the stage; it must not end the run
            log.warning("stage condition unreadable", stage=stage.name, error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    def public(self) -> list[dict[str, Any]]:
        """Every stage as written to ``state.json``."""
        return [stage.public() for stage in self.stages]

    def close(self) -> None:
        """Release the bus probe."""
        if self.probe is not None:
            self.probe.close()
