"""What ``orchard run`` prints when its output is not a terminal: one plain line per event, and a status line.

A file, a pipe or a CI log gets, as they happen: the run's stages starting and ending (``stage 2/4 sft started``),
each component starting, becoming healthy, exiting, failing (with the last lines of its log), restarting or being
stopped, prefixed with the stage that lists it; and every ``every_s`` seconds a status line with the elapsed time,
the current stage (k of n), its goals done of their totals with an ETA (``orchard.run.progress``), the latest loss
and held-out figure, how many components are up, the record counts, the newest policy version and the recent
reward and success rate. Lines are written and flushed one at a time, so ``tail -f`` on the file follows the run.
Events are found by comparing each tick's states with the last ones: the supervisor needs no hook for them.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from orchard.run.live import BusMetrics, Metrics, RunProgress
from orchard.run.progress import clock, focus_stage, latest_loss, progress_summary
from orchard.run.rundir import RunDir
from orchard.run.stages import StageRunner, StageState
from orchard.run.supervisor import ComponentState
from orchard.topics import MODEL_CALLS, OUTCOMES, SAMPLES, TRAJECTORIES

LOG_LINES_ON_FAILURE = 5
LOG_LINE_CHARS = 200
START_HEADER = '"event": "orchard run: starting component"'  # the line the supervisor writes before each start
UP = ("starting", "healthy", "unhealthy")
_LATER = ("stopping", "stopped")  # told after the stage events of the same tick: a stage's end stops them
_SETTLED = ("pending", "stopped", "exited")
_COUNTED = ((MODEL_CALLS, "calls"), (OUTCOMES, "episodes"), (TRAJECTORIES, "trajectories"), (SAMPLES, "samples"))


def last_lines(path: Path, count: int = LOG_LINES_ON_FAILURE) -> list[str]:
    """The last ``count`` non-empty lines of a log file written since the supervisor's last start header (the
    latest attempt only), each cut to ``LOG_LINE_CHARS``; [] if unreadable."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - 64 * 1024))
            lines = log.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    starts = [i for i, line in enumerate(lines) if START_HEADER in line]
    latest = lines[starts[-1] + 1 :] if starts else lines
    return [line[:LOG_LINE_CHARS] for line in latest if line.strip()][-count:]


class PlainView:
    """A line per stage and component event, and a status line every ``every_s`` seconds."""

    def __init__(
        self,
        metrics: BusMetrics,
        stages: StageRunner,
        run_dir: RunDir,
        *,
        out: TextIO | None = None,
        every_s: float = 5.0,
    ) -> None:
        self.metrics, self.stages, self.run_dir, self.every_s = metrics, stages, run_dir, every_s
        self.out = out or sys.stdout
        self.progress = RunProgress(stages.config, run_dir.root.resolve())
        self._components: dict[str, tuple[str, int]] | None = None  # None until the first update
        self._last: list[ComponentState] = []
        self._status = ""  # the last status line written
        self._stages = {stage.config.name: stage.status for stage in stages.stages}
        self._began = self._status_at = time.monotonic()

    def __enter__(self) -> PlainView:
        self.say(f"run {self.run_dir.root.resolve()}: {self._plan()}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.update(self._last)  # the final states (the last components stopped after the last tick)
        final = self.status_line(self._last, self.metrics.read(fresh=True))
        if final != self._status:
            self.say(final)
        self.metrics.close()

    def say(self, line: str) -> None:
        """Write one timestamped line and flush it."""
        self.out.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        self.out.flush()

    def update(self, components: list[ComponentState]) -> None:
        """Tell what changed since the last call; the status line when due."""
        self._last = components
        if self._components is None:  # what a resume settled before is not news
            self._components = {c.name: (c.status, c.restarts) for c in components if c.status in _SETTLED}
        seen = self._components
        changed = [c for c in components if seen.get(c.name) != (c.status, c.restarts)]
        for state in changed:
            seen[state.name] = (state.status, state.restarts)
        for state in changed:
            if state.status not in _LATER:
                self._component_event(state)
        self._stage_events()
        for state in changed:
            if state.status == "stopped":
                self._component_event(state)
        if time.monotonic() - self._status_at >= self.every_s:
            self._status_at = time.monotonic()
            self._status = self.status_line(components, self.metrics.read())
            self.say(self._status)

    def status_line(self, components: Sequence[ComponentState], metrics: Metrics) -> str:
        """``status H:MM:SS | stage k/n NAME H:MM:SS | goals | loss, held-out | components | records | reward``
        (the goals and figures where known)."""
        parts = [f"status {clock(time.monotonic() - self._began)}"]
        stage = self.stages.current
        figures = self.progress.figures(metrics, focus_stage(self.stages.stages))
        if stage is not None:
            since = f" {clock(time.time() - stage.started_at)}" if stage.started_at else ""
            parts.append(f"stage {self._position(stage)} {stage.config.name}{since}")
            goals = self.progress.progress(stage, figures) if stage.status == "running" else []
            parts += [", ".join(progress_summary(p) for p in goals)] if goals else []
        latest = latest_loss(figures)
        told = [f"loss {latest[2]:.4f} ({latest[0]} step {latest[1]})"] if latest else []
        if figures.heldout:
            told.append(f"held-out {figures.heldout[-1].stage} {figures.heldout[-1].success_rate:.1%}")
        parts += [", ".join(told)] if told else []
        parts.append(_component_counts(components))
        parts.append(_figures(metrics))
        return " | ".join(parts)

    # ------------------------------------------------------------------------------------------------ events
    def _component_event(self, state: ComponentState) -> None:
        where = self._stage_of(state.name)
        prefix = f"{where}: {state.name}" if where else state.name
        text = _describe(state)
        if text is None:
            return
        self.say(f"{prefix} {text}")
        if state.status == "failed":
            log = self.run_dir.log(state.name)
            for line in last_lines(log):
                self.say(f"  | {line}")
            self.say(f"  full log: {log.resolve()}")

    def _stage_events(self) -> None:
        for stage in self.stages.stages:
            name = stage.config.name
            if self._stages.get(name) == stage.status:
                continue
            self._stages[name] = stage.status
            self.say(f"stage {self._position(stage)} {name} {self._stage_text(stage)}")

    def _stage_text(self, stage: StageState) -> str:
        if stage.status == "running":
            about = f": {stage.config.description}" if stage.config.description else ""
            listed = ", ".join(stage.config.components) or "no components"
            return f"started ({listed}){about}"
        took = f" in {clock(stage.ended_at - stage.started_at)}" if stage.ended_at and stage.started_at else ""
        timeout = f" (not done within {stage.config.timeout_s:g} s)" if stage.status == "failed" else ""
        return f"{stage.status}{took}{timeout}"

    # ------------------------------------------------------------------------------------------------ helpers
    def _position(self, stage: StageState) -> str:
        return f"{self.stages.stages.index(stage) + 1}/{len(self.stages.stages)}"

    def _stage_of(self, name: str) -> str | None:
        """The stage listing component ``name``: the current one if it does, else the first that does."""
        current = self.stages.current
        if current is not None and name in current.config.components:
            return current.config.name
        return next((s.config.name for s in self.stages.stages if name in s.config.components), None)

    def _plan(self) -> str:
        stages = self.stages.stages
        if not stages:
            return "no stages"
        done = [s.config.name for s in stages if s.status == "completed"]
        resumed = f"; resuming after {', '.join(done)}" if done else ""
        return f"{len(stages)} stages: {' -> '.join(s.config.name for s in stages)}{resumed}"


def _describe(state: ComponentState) -> str | None:
    """What a component's new status says, or None for a status not worth a line (pending, stopping)."""
    code = "not healthy in time" if state.exit_code is None else f"exit code {state.exit_code}"
    if state.status == "starting":
        return f"started (pid {state.pid}" + (f", restart {state.restarts})" if state.restarts else ")")
    if state.status == "backoff":
        delay = max(0.0, state.next_start - time.monotonic())
        return f"down ({code}); restarting in {delay:.1f} s (restart {state.restarts})"
    if state.status == "failed":
        return f"failed ({code})"
    if state.status == "exited":
        return f"exited {state.exit_code if state.exit_code is not None else 0}"
    return {"healthy": "healthy", "unhealthy": "unhealthy (its health check fails)", "stopped": "stopped"}.get(
        state.status
    )


def _component_counts(components: Sequence[ComponentState]) -> str:
    counts = Counter("up" if c.status in UP else c.status for c in components)
    order = ("up", "exited", "backoff", "failed", "stopped", "pending", "stopping")
    return "components " + ", ".join(f"{counts[key]} {key}" for key in order if counts[key])


def _figures(metrics: Metrics) -> str:
    if metrics.error and not metrics.counts:
        return f"bus n/a ({metrics.error})"
    parts = [f"{label} {metrics.counts.get(topic, 0)}" for topic, label in _COUNTED]
    for weights in sorted(metrics.weights.values(), key=lambda w: w.model):
        parts.append(f"{weights.model} v{weights.version}")
    if metrics.mean_reward is not None and metrics.success_rate is not None:
        parts.append(f"reward {metrics.mean_reward:.3f}, success {metrics.success_rate:.0%}")
    return ", ".join(parts)
