"""The follower: sends what a run directory holds to one tracker, pass after pass, without sending anything twice.

Each pass reads every trainer's ``metrics.jsonl`` from where the last pass stopped (``trainer/<name>/<key>`` at the
line's step), the held-out rows of ``results.json`` not sent yet (``eval/<stage>/<field>`` and ``eval/success_rate``
at the row's position), and the new outcomes of the run's bus (``outcomes/*`` and a ``samples/episodes`` table per
closed policy version, see ``orchard.tracking.outcomes``); then it flushes the tracker and saves its state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchard.config import BusConfig
from orchard.logging import get_logger
from orchard.tracking.base import Tracker
from orchard.tracking.outcomes import OutcomeReader, VersionTally, training_outcome
from orchard.tracking.run_files import (
    ENDED,
    StageSpan,
    eval_scalars,
    heldout_rows,
    new_lines,
    run_state,
    stage_spans,
    trainer_scalars,
)
from orchard.tracking.state import FollowState

log = get_logger("orchard.tracking")


class Follower:
    """Sends one run's figures to one tracker; ``state_path`` remembers how far it got."""

    def __init__(self, run_dir: Path, run_id: str, tracker: Tracker, state_path: Path, *,
                 bus: BusConfig | None = None, samples: int = 5) -> None:  # fmt: skip
        self.run_dir, self.run_id, self.tracker, self.state_path = run_dir, run_id, tracker, state_path
        self.samples = samples
        self.state = FollowState.load(state_path)
        self._outcomes = OutcomeReader(bus, self.state.outcome_offsets) if bus is not None else None

    def sync(self, *, final: bool = False) -> int:
        """One pass; ``final``: the run is over, so the newest policy version is closed too. Returns points sent."""
        stages = stage_spans(run_state(self.run_dir))
        sent = self._metrics(stages) + self._results() + self._episodes(final)
        self.tracker.flush()
        if self._outcomes is not None:
            self.state.outcome_offsets = dict(self._outcomes.offsets)
        self.state.save(self.state_path)
        return sent

    def close(self) -> None:
        """Release the bus and close the tracker."""
        try:
            if self._outcomes is not None:
                self._outcomes.close()
        finally:
            self.tracker.close()

    def _metrics(self, stages: list[StageSpan]) -> int:
        sent = 0
        for path in sorted(self.run_dir.glob("*/metrics.jsonl")):
            key = path.relative_to(self.run_dir).as_posix()
            rows, self.state.metrics[key] = new_lines(path, self.state.metrics.get(key, 0))
            for row in rows:
                if (scalars := trainer_scalars(path.parent.name, row, stages)) is not None:
                    self.tracker.log_scalars(scalars)
                    sent += 1
        return sent

    def _results(self) -> int:
        sent = 0
        for position, row in enumerate(heldout_rows(self.run_dir)):
            if self.state.results.get(row.stage) != row.evaluated_at:
                self.tracker.log_scalars(eval_scalars(position, row))
                self.state.results[row.stage] = row.evaluated_at
                sent += 1
        return sent

    def _episodes(self, final: bool) -> int:
        sent = 0
        for fields, ended in self._outcomes.read() if self._outcomes is not None else []:
            if training_outcome(fields, self.run_id):
                sent += self._count(fields, ended)
        if final and self.state.open_version is not None and not self.state.open_sent:
            sent += self._send_open()
        return sent

    def _count(self, fields: dict[str, Any], ended: int) -> int:
        version, state, sent = int(fields["policy_version"]), self.state, 0
        if state.open_version is None or version > state.open_version:
            if state.open_version is not None and not state.open_sent:
                sent = self._send_open()
            state.open_version, state.open_tally, state.open_sent = version, VersionTally(), False
        if version < state.open_version or state.open_sent:
            state.late_episodes += 1
            return sent
        state.open_tally.add(fields, ended, self.samples)
        return sent

    def _send_open(self) -> int:
        version, tally = self.state.open_version, self.state.open_tally
        assert version is not None  # noqa: S101 - callers check
        scalars = tally.scalars(version)
        late = {"outcomes/late_episodes": float(self.state.late_episodes)}
        self.tracker.log_scalars(replace(scalars, values={**scalars.values, **late}))
        self.tracker.log_table(tally.table(version))
        self.state.open_sent = True
        return 2


def run_over(run_dir: Path) -> bool:
    """Whether the run's ``state.json`` says it ended (a directory without one is not a running run: over too)."""
    state = run_state(run_dir)
    return not state or state.get("status") in ENDED


def follow(followers: list[Follower], run_dir: Path, *, poll_s: float, stop: Callable[[], bool]) -> None:
    """Pass after pass every ``poll_s`` until the run is over or ``stop()``; then a final pass."""
    while not stop() and not run_over(run_dir):
        for follower in followers:
            follower.sync()
        deadline = time.monotonic() + poll_s
        while not stop() and time.monotonic() < deadline:
            time.sleep(min(0.2, poll_s))
    for follower in followers:
        follower.sync(final=True)
    log.info("tracking done", run_dir=str(run_dir))
