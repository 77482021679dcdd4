"""The stages of ``orchard run``: which stage runs, which components it may start, and whether it is done.

Stages run one after another. A stage's ``components`` may start only once the stage begins (components no stage
lists may start at once); a stage is done when every condition of its ``until`` holds: components exited 0, a
policy version published, a topic holding enough records. The bus conditions are read here, cheaply (topic record
counts, and the ``policy-versions`` topic read without a group), so the supervisor's loop only asks ``done``.
Finished stages are recorded in ``state.json``; a resumed run skips the stages it already completed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from orchard.bus import Bus, Consumer, open_bus
from orchard.codec import Codec
from orchard.config import BusConfig
from orchard.logging import get_logger
from orchard.run.config import RunConfig, StageConfig
from orchard.topics import POLICY_VERSIONS

log = get_logger("run.stages")

StageStatus = Literal["pending", "running", "completed", "failed"]
PROBE_EVERY_S = 0.5


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
    """Reads the run's bus for stage conditions: topic record counts and the newest policy version of the run."""

    def __init__(self, bus_config: BusConfig, run_id: str) -> None:
        self.bus_config, self.run_id = bus_config, run_id
        self._bus: Bus | None = None
        self._versions: Consumer | None = None
        self._codec = Codec.default()
        self.newest_version: int | None = None

    def count(self, topic: str) -> int:
        """Records ``topic`` holds (0 while it does not exist)."""
        bus = self._open()
        return bus.describe_topic(topic).record_count if topic in set(bus.list_topics()) else 0

    def policy_version(self) -> int | None:
        """The highest ``PolicyVersion.version`` of this run published so far."""
        bus = self._open()
        if self._versions is None:
            bus.create_topic(POLICY_VERSIONS, exist_ok=True)
            self._versions = bus.consumer([POLICY_VERSIONS], group=None, start="earliest")
        while records := self._versions.poll(timeout_s=0.05):
            for record in records:
                decoded = self._codec.decode(record.value)
                if decoded.name == "PolicyVersion" and decoded.record["run_id"] == self.run_id:
                    version = int(decoded.record["version"])
                    self.newest_version = max(version, self.newest_version or version)
        return self.newest_version

    def close(self) -> None:
        """Close the consumer and the bus."""
        if self._versions is not None:
            self._versions.close()
        if self._bus is not None:
            self._bus.close()

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
