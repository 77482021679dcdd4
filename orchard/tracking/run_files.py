"""What the follower reads from the run directory: each trainer's ``metrics.jsonl`` (from a byte offset), the
held-out ``results.json``, and the stages and status in ``state.json``.

A line still being written (no newline yet) is left for the next pass; a line that is not JSON is skipped and
logged. Nothing here imports a trainer: the files are the interface.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.results import StageRow, read_rows
from orchard.logging import get_logger
from orchard.tracking.base import Scalars

log = get_logger("orchard.tracking")

ENDED = ("stopped", "completed", "failed")
"""``state.json`` statuses of a run that is over."""
EVAL_FIELDS = ("success_rate", "success_ci_low", "success_ci_high", "mean_reward", "pass_at_1", "tasks",
               "successes", "missing", "wall_time_s", "p_value")  # fmt: skip
"""The figures of a held-out row logged as ``eval/<stage>/<field>`` (those that are known)."""
_NOT_SCALARS = ("step", "time")


@dataclass(frozen=True, slots=True)
class StageSpan:
    """One stage's name and times (seconds since the epoch; None: not started / still running)."""

    name: str
    started: float | None
    ended: float | None

    def holds(self, when: float) -> bool:
        """Whether ``when`` falls in the stage."""
        return self.started is not None and self.started <= when and (self.ended is None or when <= self.ended)


def new_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON lines of ``path`` after byte ``offset``, and the offset after the last of them.

    A file shorter than ``offset`` was replaced: it is read again from its start.
    """
    with path.open("rb") as file:
        if file.seek(0, 2) < offset:
            log.warning("metrics file shrank; reading it from the start", path=str(path))
            offset = 0
        file.seek(offset)
        data = file.read()
    complete = data[: data.rfind(b"\n") + 1]
    rows = []
    for line in complete.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            log.warning("metrics line is not JSON; skipped", path=str(path), line=line[:200])
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows, offset + len(complete)


def trainer_scalars(trainer: str, row: dict[str, Any], stages: list[StageSpan]) -> Scalars | None:
    """One metrics line as ``trainer/<trainer>/<key>`` at its ``step``, tagged with stage and policy version."""
    step, when = row.get("step"), row.get("time")
    if not isinstance(step, int):
        return None
    values = {f"trainer/{trainer}/{key}": float(value) for key, value in row.items()
              if key not in _NOT_SCALARS and _is_number(value)}  # fmt: skip
    wall_time = float(when) if _is_number(when) else None
    tags = {"policy_version": str(row["policy_version"])} if _is_number(row.get("policy_version")) else {}
    stage = stage_at(stages, wall_time)
    return Scalars(values, step, wall_time, tags | ({"stage": stage} if stage else {}))


def eval_scalars(position: int, row: StageRow) -> Scalars:
    """A held-out row as ``eval/<stage>/<field>`` and ``eval/success_rate``, at its position in the table."""
    known = {name: getattr(row, name) for name in EVAL_FIELDS if getattr(row, name) is not None}
    values = {f"eval/{row.stage}/{name}": float(value) for name, value in known.items()}
    values |= {"eval/success_rate": row.success_rate, "eval/mean_reward": row.mean_reward}
    return Scalars(values, position, None, {"stage": row.stage})


def heldout_rows(run_dir: Path) -> list[StageRow]:
    """The rows of ``results.json`` ([] when absent or unreadable)."""
    try:
        return read_rows(run_dir)
    except ResultsError as exc:
        log.warning("results unreadable", error=str(exc))
        return []


def run_state(run_dir: Path) -> dict[str, Any]:
    """``state.json`` ({} when absent or half written)."""
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def stage_spans(state: dict[str, Any]) -> list[StageSpan]:
    """The stages of a ``state.json``, in recipe order."""
    return [
        StageSpan(
            str(entry["name"]),
            _seconds(entry.get("first_started_at") or entry.get("started_at")),
            _seconds(entry.get("ended_at")),
        )  # fmt: skip
        for entry in state.get("stages") or []
        if isinstance(entry, dict) and "name" in entry
    ]


def stage_at(stages: list[StageSpan], when: float | None) -> str | None:
    """The latest-starting stage that holds ``when`` (None: none does, or no time).

    >>> stage_at([StageSpan("a", 0, 10), StageSpan("b", 10, None)], 10), stage_at([StageSpan("a", 0, 10)], 11)
    ('b', None)
    """
    if when is None:
        return None
    holding = [s for s in stages if s.holds(when)]
    return max(holding, key=lambda s: s.started or 0.0).name if holding else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isinf(value)


def _seconds(value: Any) -> float | None:
    return float(value) if _is_number(value) else None
