"""The results table of a run: one row per evaluated stage, in ``RUN_DIR/results.json`` and ``RUN_DIR/results.md``.

``results.json`` is the source of truth; ``results.md`` is rendered from it on every write. Recording a stage that is
already in the table replaces its row in place (evaluating a stage again, e.g. after a resume, never duplicates it);
a new stage is appended. Both files are replaced atomically. Per-task detail of a stage goes to
``RUN_DIR/eval/<stage>.json``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.heldout import HeldoutResult

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
DETAIL_DIR = "eval"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class StageRow:
    """One stage's line of the table."""

    stage: str
    tasks: int
    successes: int
    success_rate: float
    success_ci_low: float
    success_ci_high: float
    mean_reward: float
    reward_ci_low: float | None
    reward_ci_high: float | None
    wall_time_s: float
    samples_per_task: int = 1
    missing: int = 0
    evaluated_at: str = ""

    @classmethod
    def from_result(cls, result: HeldoutResult) -> StageRow:
        """The row of a held-out evaluation."""
        return cls(
            stage=result.stage,
            tasks=result.success.n,
            successes=result.success.successes,
            success_rate=result.success.rate,
            success_ci_low=result.success.low,
            success_ci_high=result.success.high,
            mean_reward=result.reward.mean,
            reward_ci_low=result.reward.low,
            reward_ci_high=result.reward.high,
            wall_time_s=result.wall_time_s,
            samples_per_task=result.samples_per_task,
            missing=len(result.missing),
            evaluated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageRow:
        """A row read back from ``results.json`` (unknown keys ignored, so older readers accept newer files)."""
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{key: value for key, value in data.items() if key in known})
        except TypeError as exc:
            raise ResultsError(f"malformed row in {RESULTS_JSON}: {data!r} ({exc})") from exc


def read_rows(run_dir: Path) -> list[StageRow]:
    """The rows of ``run_dir``'s table ([] if there is none yet)."""
    path = run_dir / RESULTS_JSON
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ResultsError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list):
        raise ResultsError(f"{path} is not a results table (no 'stages' list)")
    return [StageRow.from_json(row) for row in data["stages"]]


def upsert(rows: list[StageRow], row: StageRow) -> list[StageRow]:
    """``rows`` with ``row`` replacing the row of the same stage in place, or appended."""
    replaced = [row if old.stage == row.stage else old for old in rows]
    return replaced if any(old.stage == row.stage for old in rows) else [*rows, row]


def record_stage(run_dir: Path, result: HeldoutResult) -> list[StageRow]:
    """Add or replace ``result``'s row in the run's table, write both files and the stage's detail; return the rows."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = upsert(read_rows(run_dir), StageRow.from_result(result))
    write_table(run_dir, rows)
    (run_dir / DETAIL_DIR).mkdir(exist_ok=True)
    _atomic_write(run_dir / DETAIL_DIR / f"{result.stage}.json", json.dumps(result.to_json(), indent=1) + "\n")
    return rows


def write_table(run_dir: Path, rows: list[StageRow]) -> None:
    """Write ``results.json`` and ``results.md`` for ``rows``."""
    payload = {"format": FORMAT_VERSION, "stages": [asdict(row) for row in rows]}
    _atomic_write(run_dir / RESULTS_JSON, json.dumps(payload, indent=1) + "\n")
    _atomic_write(run_dir / RESULTS_MD, render_markdown(rows))


def render_markdown(rows: list[StageRow]) -> str:
    """The table as Markdown: rates as percentages, intervals in brackets, wall time in seconds.

    >>> row = StageRow("sft", 4, 3, 0.75, 0.3006, 0.9544, 0.8, 0.5, 1.1, 12.34)
    >>> render_markdown([row]).splitlines()[2]
    '| sft | 4 | 75.0% (3/4) | [30.1%, 95.4%] | 0.800 [0.500, 1.100] | 12.3 |'
    """
    lines = [
        "| stage | tasks | success rate | 95% CI | mean reward [95% CI] | wall time (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.stage} | {row.tasks} | {row.success_rate:.1%} ({row.successes}/{row.tasks}) "
            f"| [{row.success_ci_low:.1%}, {row.success_ci_high:.1%}] "
            f"| {row.mean_reward:.3f} {_interval(row.reward_ci_low, row.reward_ci_high)}"
            f"| {row.wall_time_s:.1f} |"
        )
    notes = [f"- {row.stage}: best of {row.samples_per_task} per task" for row in rows if row.samples_per_task > 1]
    notes += [
        f"- {row.stage}: {row.missing} episode(s) without outcome, counted as failures" for row in rows if row.missing
    ]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{low:.3f}, {high:.3f}] "


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
