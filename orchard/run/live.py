"""What ``orchard run`` shows while it runs: a rich Live table, or (``--no-live``) structured log lines.

Metrics come from what exists, read cheaply and never allowed to break the run: record counts of the standard
topics (``describe_topic``), from the outcomes topic the mean reward and success rate of the latest episodes, and
from policy-versions the newest weights of this run per model. A topic that does not exist yet shows as 0; a bus
that cannot be read shows "n/a". Without a terminal, ``orchard run`` shows ``orchard.run.plain.PlainView`` instead.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchard.bus import Bus, Consumer, Record, open_bus
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from orchard.run.supervisor import ComponentState
from orchard.serialization_errors import SerializationError
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES, TRAJECTORIES

log = get_logger("run")

COUNTED_TOPICS = (MODEL_CALLS, OUTCOMES, TRAJECTORIES, SAMPLES, POLICY_VERSIONS)
RECENT_OUTCOMES = 100
_STATUS_STYLE = {"healthy": "green", "exited": "cyan", "starting": "yellow", "backoff": "yellow",
                 "unhealthy": "red", "failed": "bold red", "stopping": "magenta", "stopped": "dim"}  # fmt: skip


@dataclass(frozen=True)
class PublishedWeights:
    """The newest published version of one model of the run."""

    model: str
    version: int
    uri: str  # the version's folder in the store (its manifest and files)
    trainer_step: int


@dataclass
class Metrics:
    """The latest figures of a run (None where unknown)."""

    counts: dict[str, int] = field(default_factory=dict)
    mean_reward: float | None = None
    success_rate: float | None = None
    outcomes_seen: int = 0
    weights: dict[str, PublishedWeights] = field(default_factory=dict)
    error: str | None = None


def note_weights(record: Record, codec: Codec, run_id: str, weights: dict[str, PublishedWeights]) -> None:
    """Keep in ``weights`` the newest version per model that ``record`` (of policy-versions) announces for
    ``run_id``; a record of another run, or not a ``PolicyVersion``, is passed over."""
    try:
        decoded = codec.decode(record.value)
    except SerializationError:
        return
    fields = decoded.record
    if decoded.name != "PolicyVersion" or fields["run_id"] != run_id:
        return
    known = weights.get(fields["model"])
    if known is None or int(fields["version"]) >= known.version:
        folder = str(fields["uri"]).rsplit("/", 1)[0] + "/"  # the uri names the version's manifest
        weights[fields["model"]] = PublishedWeights(fields["model"], int(fields["version"]), folder,
                                                    int(fields["trainer_step"]))  # fmt: skip


class BusMetrics:
    """Reads topic counts and recent outcomes from the run's bus; every failure becomes ``Metrics.error``."""

    def __init__(self, config: OrchardConfig, every_s: float = 2.0) -> None:
        self.config, self.every_s = config, every_s
        self.metrics = Metrics()
        self._bus: Bus | None = None
        self._outcomes: Consumer | None = None
        self._versions: Consumer | None = None
        self._recent: deque[tuple[float, bool]] = deque(maxlen=RECENT_OUTCOMES)
        self._codec = Codec.default()
        self._read_at = 0.0

    def read(self, *, fresh: bool = False) -> Metrics:
        """The metrics, refreshed at most every ``every_s`` seconds (now, with ``fresh``)."""
        if not fresh and time.monotonic() - self._read_at < self.every_s:
            return self.metrics
        self._read_at = time.monotonic()
        try:
            self._refresh()
        except Exception as exc:  # noqa: BLE001 - a view must never stop the run it shows
            self.metrics.error = f"{type(exc).__name__}: {exc}"
        return self.metrics

    def _refresh(self) -> None:
        if self._bus is None:
            self._bus = open_bus(self.config.bus)
        existing = set(self._bus.list_topics())
        counts = {t: self._bus.describe_topic(t).record_count if t in existing else 0 for t in COUNTED_TOPICS}
        self.metrics.counts, self.metrics.error = counts, None
        if OUTCOMES in existing:
            self._read_outcomes()
        if POLICY_VERSIONS in existing:
            self._read_versions()

    def _read_outcomes(self) -> None:
        if self._outcomes is None:
            assert self._bus is not None  # noqa: S101 - opened by _refresh
            self._outcomes = self._bus.consumer([OUTCOMES])  # no group: reads everything, commits nothing
        for record in self._outcomes.poll(max_records=1000, timeout_s=0.05):
            fields = self._codec.decode(record.value).record
            self._recent.append((float(fields["reward"]), bool(fields["success"])))
            self.metrics.outcomes_seen += 1
        if self._recent:
            self.metrics.mean_reward = sum(r for r, _ in self._recent) / len(self._recent)
            self.metrics.success_rate = sum(s for _, s in self._recent) / len(self._recent)

    def _read_versions(self) -> None:
        if self._versions is None:
            assert self._bus is not None  # noqa: S101 - opened by _refresh
            self._versions = self._bus.consumer([POLICY_VERSIONS])
        for record in self._versions.poll(max_records=1000, timeout_s=0.05):
            note_weights(record, self._codec, self.config.run_id, self.metrics.weights)

    def close(self) -> None:
        """Release the bus."""
        for consumer in (self._outcomes, self._versions):
            if consumer is not None:
                consumer.close()
        if self._bus is not None:
            self._bus.close()


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def component_table(components: list[ComponentState]) -> Table:
    """One row per component: status, pid, restarts, uptime."""
    table = Table("component", "kind", "status", "pid", "restarts", "uptime", "exit", title="orchard run")
    for c in components:
        status = Text(c.status, style=_STATUS_STYLE.get(c.status, ""))
        exit_code = "" if c.exit_code is None else str(c.exit_code)
        table.add_row(c.name, c.kind, status, str(c.pid or "-"), str(c.restarts), _uptime(c.uptime_s()), exit_code)
    return table


def metrics_table(metrics: Metrics) -> Table:
    """Topic record counts and the recent reward and success rate."""
    table = Table(*COUNTED_TOPICS, "reward", "success", title=f"last {RECENT_OUTCOMES} outcomes; records per topic")
    if metrics.error and not metrics.counts:
        table.add_row(*(["n/a"] * len(COUNTED_TOPICS)), "n/a", "n/a")
        return table
    reward = "-" if metrics.mean_reward is None else f"{metrics.mean_reward:.3f}"
    success = "-" if metrics.success_rate is None else f"{metrics.success_rate:.1%}"
    table.add_row(*(str(metrics.counts.get(t, 0)) for t in COUNTED_TOPICS), reward, success)
    return table


class LiveView:
    """A rich Live display, refreshed by the supervisor's loop (no refresh thread: children are forked)."""

    def __init__(self, metrics: BusMetrics, console: Console | None = None, refresh_s: float = 0.5) -> None:
        self.metrics, self.refresh_s = metrics, refresh_s
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._shown = 0.0
        self._last: list[ComponentState] = []

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._shown = 0.0
        self.update(self._last)  # the final states, past the throttle
        self._live.stop()
        self.metrics.close()

    def update(self, components: list[ComponentState]) -> None:
        """Redraw at most every ``refresh_s``."""
        self._last = components
        if time.monotonic() - self._shown >= self.refresh_s:
            self._shown = time.monotonic()
            body = Group(component_table(components), metrics_table(self.metrics.read()))
            self._live.update(body, refresh=True)


class LogView:
    """``--no-live``: a structured log line per status change, and the metrics every ``every_s`` seconds."""

    def __init__(self, metrics: BusMetrics, every_s: float = 10.0) -> None:
        self.metrics, self.every_s = metrics, every_s
        self._seen: dict[str, str] = {}
        self._logged = time.monotonic()

    def __enter__(self) -> LogView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.metrics.close()

    def update(self, components: list[ComponentState]) -> None:
        """Log what changed; log the metrics when due."""
        for c in components:
            if self._seen.get(c.name) != c.status:
                self._seen[c.name] = c.status
                log.info("component status", component=c.name, status=c.status, pid=c.pid, restarts=c.restarts)
        if time.monotonic() - self._logged >= self.every_s:
            self._logged = time.monotonic()
            m = self.metrics.read()
            log.info("run metrics", **m.counts, mean_reward=m.mean_reward, success_rate=m.success_rate, error=m.error)
