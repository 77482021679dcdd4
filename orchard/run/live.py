"""What ``orchard run`` shows while it runs: a live screen on a terminal, or (``--no-live``) structured log lines.

Metrics come from what exists, read cheaply and never allowed to break the run: record counts of the standard
topics (``describe_topic``), from the outcomes topic (this run's records) the mean reward and success rate of the
latest episodes and when each episode ended, and from policy-versions the newest weights of this run per model. A
topic that does not exist yet shows as 0; a bus that cannot be read shows "n/a". ``RunProgress`` adds what the run
directory holds: the last step and loss of each policy trainer (its ``metrics.jsonl``), the held-out rows of
``results.json``, and the totals some goals are counted from (task directories, demonstrations). What a stage's
progress is, and how the screen is laid out to fit 80 x 24, is ``orchard.run.progress``. Without a terminal,
``orchard run`` shows ``orchard.run.plain.PlainView`` instead.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from orchard.bus import Bus, Consumer, Record, open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.episode_groups import is_eval_group
from orchard.logging import get_logger
from orchard.run.config import RunConfig
from orchard.run.progress import (
    DEMONSTRATIONS,
    Figures,
    Goal,
    Heldout,
    Progress,
    Rates,
    Snapshot,
    TrainerPoint,
    focus_stage,
    screen_lines,
    stage_goals,
    stage_progress,
    trainer_metrics,
)
from orchard.run.rundir import RunDir
from orchard.run.stages import StageRunner, StageState
from orchard.run.supervisor import ComponentState
from orchard.serialization_errors import SerializationError
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SAMPLES, TRAJECTORIES

log = get_logger("run")

COUNTED_TOPICS = (MODEL_CALLS, OUTCOMES, TRAJECTORIES, SAMPLES, POLICY_VERSIONS)
RECENT_OUTCOMES = 100
READ_BUDGET_S = 0.2  # one refresh reads the outcomes topic for at most this long; the rest on the next
TAIL_BYTES = 16 * 1024  # of a metrics.jsonl: enough for its last line


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
    outcomes_seen: int = 0  # of this run
    weights: dict[str, PublishedWeights] = field(default_factory=dict)
    episode_ends_ms: list[int] = field(default_factory=list)  # when each training episode of this run ended
    eval_ends: list[tuple[int, str]] = field(default_factory=list)  # (ended ms, group id) of each evaluation episode
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
        records = read_until_quiet(
            self._outcomes, max_records=1000, poll_timeout_s=0.05, idle_polls=1, budget_s=READ_BUDGET_S
        )
        for record in records:
            self._note_outcome(record)
        if self._recent:
            self.metrics.mean_reward = sum(r for r, _ in self._recent) / len(self._recent)
            self.metrics.success_rate = sum(s for _, s in self._recent) / len(self._recent)

    def _note_outcome(self, record: Record) -> None:
        """Count one outcome of this run: its reward and success, and when it ended (training or evaluation)."""
        try:
            decoded = self._codec.decode(record.value)
        except SerializationError:
            return
        fields = decoded.record
        if decoded.name != "EpisodeOutcome" or fields["run_id"] != self.config.run_id:
            return
        self._recent.append((float(fields["reward"]), bool(fields["success"])))
        self.metrics.outcomes_seen += 1
        ended = fields["ended_at"]  # a datetime, or milliseconds
        ended_ms = int(ended.timestamp() * 1000) if hasattr(ended, "timestamp") else int(ended)
        group = str(fields["group_id"])
        if is_eval_group(group):
            self.metrics.eval_ends.append((ended_ms, group))
        else:
            self.metrics.episode_ends_ms.append(ended_ms)

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


def last_point(path: Path) -> TrainerPoint | None:
    """The last complete line of a trainer's ``metrics.jsonl`` as a point (None: no such file, or no step yet)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, 2) - TAIL_BYTES))
            data = handle.read()
    except OSError:
        return None
    for line in reversed(data[: data.rfind(b"\n") + 1].splitlines()):  # a line still being written is left out
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            loss, when = row.get("loss"), row.get("time")
            return TrainerPoint(row["step"], _number(loss), _number(when))
    return None


def counted_total(path: Path) -> int | None:
    """What a goal's ``total_of`` counts: the lines of a ``demonstrations.jsonl``, or the task directories (with a
    ``task.yaml``) under a directory; None while it is not there."""
    try:
        if path.name == DEMONSTRATIONS:
            with path.open("rb") as handle:
                return sum(1 for line in handle if line.strip())
        return sum(1 for d in path.iterdir() if (d / "task.yaml").is_file()) or None
    except OSError:
        return None


def heldout_rows(root: Path) -> list[Heldout]:
    """The rows of the run's ``results.json`` ([] when there is none, or it cannot be read)."""
    from orchard.evaluation.exceptions import ResultsError  # numpy: only once a view reads results
    from orchard.evaluation.results import read_rows

    try:
        rows = read_rows(root)
    except ResultsError:
        return []
    return [Heldout(r.stage, r.tasks, r.success_rate, r.success_ci_low, r.success_ci_high) for r in rows]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class RunProgress:
    """The run's ``Figures`` (bus metrics plus its files, re-read at most every ``every_s``) and the progress of
    the stage shown, with the rates of its goals."""

    def __init__(self, config: RunConfig, root: Path, every_s: float = 2.0) -> None:
        self.config, self.root, self.every_s = config, root, every_s
        self.rates = Rates()
        self._metrics_files = trainer_metrics(config, root)
        self._goals: dict[str, list[Goal]] = {}
        self._points: dict[str, TrainerPoint] = {}
        self._totals: dict[str, int] = {}
        self._heldout: list[Heldout] = []
        self._results_mtime: float | None = None
        self._read_at = -every_s

    def figures(self, metrics: Metrics, stage: StageState | None) -> Figures:
        """What is known now: ``metrics`` and the run's files (those of ``stage``'s goals among them)."""
        if time.monotonic() - self._read_at >= self.every_s:
            self._read_at = time.monotonic()
            try:
                self._read_files(self.goals(stage) if stage is not None else [])
            except Exception as exc:  # noqa: BLE001 - a view must never stop the run it shows
                log.warning("run files unreadable", error=f"{type(exc).__name__}: {exc}")
        weights = metrics.weights.values()
        return Figures(
            counts=metrics.counts, episode_ends_ms=metrics.episode_ends_ms, eval_ends=metrics.eval_ends,
            trainer_points=dict(self._points), published_steps={w.model: w.trainer_step for w in weights},
            versions={w.model: w.version for w in weights}, totals=dict(self._totals), heldout=list(self._heldout),
            mean_reward=metrics.mean_reward, success_rate=metrics.success_rate,
            recent=min(metrics.outcomes_seen, RECENT_OUTCOMES), error=metrics.error,
        )  # fmt: skip

    def goals(self, stage: StageState) -> list[Goal]:
        """The goals of ``stage`` (worked out once per stage)."""
        name = stage.config.name
        if name not in self._goals:
            self._goals[name] = stage_goals(stage.config, self.config, self.root)
        return self._goals[name]

    def progress(self, stage: StageState, figures: Figures) -> list[Progress]:
        """The progress of ``stage``'s goals, their rates updated."""
        return stage_progress(stage, self.goals(stage), figures, self.rates, time.monotonic())

    def _read_files(self, goals: Sequence[Goal]) -> None:
        for name, path in self._metrics_files.items():
            point = last_point(path)
            if point is not None:
                self._points[name] = point
        for goal in goals:
            key = str(goal.total_of)
            if goal.total is None and goal.total_of is not None and key not in self._totals:
                total = counted_total(goal.total_of)
                if total:
                    self._totals[key] = total  # written once, before the stage that counts it
        results = self.root / "results.json"
        mtime = results.stat().st_mtime if results.exists() else None
        if mtime != self._results_mtime:
            self._results_mtime, self._heldout = mtime, heldout_rows(self.root)


class LiveView:
    """The live screen (``orchard.run.progress.screen_lines``) in a rich Live display, fitted to the terminal and
    refreshed by the supervisor's loop (no refresh thread: children are forked)."""

    def __init__(
        self,
        metrics: BusMetrics,
        stages: StageRunner,
        run_dir: RunDir,
        *,
        console: Console | None = None,
        refresh_s: float = 0.5,
    ) -> None:
        self.metrics, self.stages, self.refresh_s = metrics, stages, refresh_s
        self.console = console or Console()
        self.progress = RunProgress(stages.config, run_dir.root.resolve())
        self._live = Live(console=self.console, auto_refresh=False, transient=False)
        self._shown = 0.0
        self._began = time.monotonic()
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
            self._live.update(Group(*self.lines(components)), refresh=True)

    def lines(self, components: list[ComponentState]) -> list[Text]:
        """The screen for ``components`` now, fitted to the console's size."""
        stage = focus_stage(self.stages.stages)
        figures = self.progress.figures(self.metrics.read(), stage)
        progress = self.progress.progress(stage, figures) if stage is not None else []
        snap = Snapshot(self.metrics.config.run_id, self.stages.config, self.stages.stages, components, figures,
                        progress, time.monotonic() - self._began, time.time())  # fmt: skip
        return screen_lines(snap, self.console.size.width, self.console.size.height)


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
