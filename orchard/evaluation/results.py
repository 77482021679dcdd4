"""The results table of a run: one row per evaluated stage, in ``RUN_DIR/results.json`` and ``RUN_DIR/results.md``.

``results.json`` is the source of truth; ``results.md`` is rendered from it on every write. Recording a stage that is
already in the table replaces its row in place (evaluating a stage again, e.g. after a resume, never duplicates it);
a new stage is appended. Both files are replaced atomically. A stage's detail goes to ``RUN_DIR/eval/<stage>.json``
(summary, breakdowns, cost, every task's labels and episodes) and ``RUN_DIR/eval/<stage>.md`` (the same, readable).

Each row says how its figure was obtained (``selection``: ``first``, ``pass@K`` or ``rerank@K``) and what it cost.
Rows written before those columns existed read back with defaults: ``selection`` is ``rerank@K`` for a row of K > 1
samples (``--rerank`` was the only way to get one), else ``first``; the cost columns are unknown (None). Each row
also records where it was measured (``environment``: Python, torch and the other libraries that round a model's
numbers, the CPU; ``orchard.evaluation.environment``), named in the notes under the table.

Each row keeps its per-task outcomes (``task_outcomes``: task id -> whether the episode that counts succeeded, the
figures its success rate is made of), and every row after the first is compared with the row before it on their
common tasks by the exact McNemar test (``orchard.evaluation.paired``): ``vs_stage``, ``pairs``, ``wins``,
``losses``, ``p_value``. The comparisons are recomputed on every write, so replacing a stage's row also updates the
comparison of the stage after it. A row without ``task_outcomes`` (written by an older Orchard) takes them from its
``eval/<stage>.json`` detail when that is there; otherwise its comparisons are unknown (None).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from orchard.evaluation.environment import describe, software_environment
from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.heldout import HeldoutResult
from orchard.evaluation.paired import paired_test
from orchard.evaluation.report import render_stage_markdown

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
    selection: str = "first"
    pass_at_1: float | None = None
    model_calls: int | None = None
    calls_read: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    episode_time_s: float | None = None
    task_outcomes: dict[str, bool] | None = None
    vs_stage: str | None = None
    pairs: int | None = None
    wins: int | None = None
    losses: int | None = None
    p_value: float | None = None
    environment: dict[str, str] | None = None
    """Where the row was measured (``environment.software_environment``); None in rows written before it."""

    @property
    def total_tokens(self) -> int | None:
        """Prompt plus completion tokens (None when unknown)."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_result(cls, result: HeldoutResult) -> StageRow:
        """The row of a held-out evaluation."""
        cost = result.cost
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
            selection=result.selection,
            pass_at_1=result.mean_success,
            model_calls=None if cost is None else cost.model_calls,
            calls_read=None if cost is None else cost.calls_read,
            prompt_tokens=None if cost is None else cost.prompt_tokens,
            completion_tokens=None if cost is None else cost.completion_tokens,
            episode_time_s=None if cost is None else cost.episode_time_s,
            task_outcomes={task.task_id: task.chosen.success for task in result.tasks},
            environment=software_environment(),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageRow:
        """A row read back from ``results.json`` (unknown keys ignored, so older readers accept newer files; keys
        an older writer lacked get their defaults, ``selection`` inferred from ``samples_per_task``)."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if "selection" not in values:
            samples = values.get("samples_per_task", 1)
            values["selection"] = f"rerank@{samples}" if isinstance(samples, int) and samples > 1 else "first"
        try:
            return cls(**values)
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
    rows = [StageRow.from_json(row) for row in data["stages"]]
    return [row if row.task_outcomes is not None else _outcomes_from_detail(run_dir, row) for row in rows]


def _outcomes_from_detail(run_dir: Path, row: StageRow) -> StageRow:
    """``row`` with the per-task outcomes of its ``eval/<stage>.json`` (unchanged when there is none to read)."""
    try:
        detail = json.loads(stage_paths(run_dir, row.stage)[0].read_text())
        outcomes = {
            str(task["task_id"]): any(e["success"] for e in task["episodes"] if e["episode_id"] == task["chosen"])
            for task in detail["tasks"]
        }
    except (OSError, ValueError, KeyError, TypeError):
        return row
    return replace(row, task_outcomes=outcomes)


def with_paired_tests(rows: list[StageRow]) -> list[StageRow]:
    """``rows`` with each one's exact McNemar test against the row before it (None where either lacks outcomes)."""
    out: list[StageRow] = []
    for i, row in enumerate(rows):
        before = rows[i - 1] if i else None
        if before is None or before.task_outcomes is None or row.task_outcomes is None:
            out.append(replace(row, vs_stage=None, pairs=None, wins=None, losses=None, p_value=None))
            continue
        test = paired_test(before.stage, before.task_outcomes, row.task_outcomes)
        out.append(replace(row, vs_stage=test.baseline, pairs=test.pairs, wins=test.wins, losses=test.losses,
                           p_value=test.p_value))  # fmt: skip
    return out


def upsert(rows: list[StageRow], row: StageRow) -> list[StageRow]:
    """``rows`` with ``row`` replacing the row of the same stage in place, or appended."""
    replaced = [row if old.stage == row.stage else old for old in rows]
    return replaced if any(old.stage == row.stage for old in rows) else [*rows, row]


def record_stage(run_dir: Path, result: HeldoutResult) -> list[StageRow]:
    """Add or replace ``result``'s row in the run's table, write both files and the stage's detail; return the rows."""
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = with_paired_tests(upsert(read_rows(run_dir), StageRow.from_result(result)))
    write_table(run_dir, rows)
    detail = stage_paths(run_dir, result.stage)
    detail[0].parent.mkdir(exist_ok=True)
    _atomic_write(detail[0], json.dumps(result.to_json(), indent=1) + "\n")
    _atomic_write(detail[1], render_stage_markdown(result))
    return rows


def stage_paths(run_dir: Path, stage: str) -> tuple[Path, Path]:
    """The JSON and Markdown detail files of ``stage`` in ``run_dir``."""
    return run_dir / DETAIL_DIR / f"{stage}.json", run_dir / DETAIL_DIR / f"{stage}.md"


def write_table(run_dir: Path, rows: list[StageRow]) -> None:
    """Write ``results.json`` and ``results.md`` for ``rows``."""
    payload = {"format": FORMAT_VERSION, "stages": [asdict(row) for row in rows]}
    _atomic_write(run_dir / RESULTS_JSON, json.dumps(payload, indent=1) + "\n")
    _atomic_write(run_dir / RESULTS_MD, render_markdown(rows))


def render_markdown(rows: list[StageRow]) -> str:
    """The table as Markdown: rates as percentages, intervals in brackets, the paired test against the row above
    (wins/losses of the pairs, exact p), wall time in seconds, '-' for unknown.

    >>> row = StageRow("sft", 4, 3, 0.75, 0.3006, 0.9544, 0.8, 0.5, 1.1, 12.34)
    >>> render_markdown([row]).splitlines()[2]
    '| sft | first | 4 | 75.0% (3/4) | [30.1%, 95.4%] | - | - | - | 0.800 [0.500, 1.100] | - | - | 12.3 |'
    """
    lines = [
        "| stage | selection | tasks | success rate | 95% CI | vs previous: wins/losses | exact p | pass@1 "
        "| mean reward [95% CI] | model calls | tokens | wall time (s) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.stage} | {row.selection} | {row.tasks} | {row.success_rate:.1%} ({row.successes}/{row.tasks}) "
            f"| [{row.success_ci_low:.1%}, {row.success_ci_high:.1%}] | {_paired(row)} | {p_value_text(row.p_value)} "
            f"| {_percent(row.pass_at_1)} | {row.mean_reward:.3f} {_interval(row.reward_ci_low, row.reward_ci_high)}"
            f"| {_count(row.model_calls)} | {_count(row.total_tokens)} | {row.wall_time_s:.1f} |"
        )
    return "\n".join(lines + _notes(rows)) + "\n"


def _notes(rows: list[StageRow]) -> list[str]:
    notes = [_selection_note(row) for row in rows if row.samples_per_task > 1]
    notes += [
        f"- {row.stage}: {row.missing} episode(s) without outcome, counted as failures" for row in rows if row.missing
    ]
    notes += [
        f"- {row.stage}: tokens of {row.calls_read} of {row.model_calls} model calls only (the rest not read in time)"
        for row in rows
        if row.calls_read is not None and row.model_calls is not None and row.calls_read < row.model_calls
    ]
    notes += [
        f"- {row.stage} vs {row.vs_stage}: {row.pairs} of its {row.tasks} tasks paired (the others were not evaluated "
        "in both stages)"
        for row in rows
        if row.pairs is not None and row.pairs < row.tasks
    ]
    if any(row.p_value is not None for row in rows):
        notes.append(
            "- vs previous: tasks this stage solves and the stage above fails (wins) / the reverse (losses), on the "
            "tasks both evaluated; exact p: two-sided exact McNemar test (binomial on the discordant pairs)"
        )
    notes += _environment_notes(rows)
    return [""] + notes if notes else []


def _environment_notes(rows: list[StageRow]) -> list[str]:
    """One line when every row that records its environment shares it, else one per row."""
    recorded = [row for row in rows if row.environment]
    distinct = {describe(row.environment or {}) for row in recorded}
    if len(distinct) == 1:
        return [f"- measured with {distinct.pop()}"]
    return [f"- {row.stage}: measured with {describe(row.environment or {})}" for row in recorded]


def p_value_text(p: float | None) -> str:
    """A p-value for a table: three decimals, scientific below 0.001, '-' when unknown.

    >>> p_value_text(0.0390625), p_value_text(0.00001234), p_value_text(None)
    ('0.039', '1.2e-05', '-')
    """
    if p is None:
        return "-"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _paired(row: StageRow) -> str:
    if row.wins is None or row.losses is None:
        return "-"
    return f"+{row.wins}/-{row.losses} of {row.pairs}"


def _selection_note(row: StageRow) -> str:
    k = row.samples_per_task
    if row.selection.startswith("pass@"):
        return f"- {row.stage}: {k} attempts per task, solved when any succeeds (pass@{k}); pass@1 over all attempts"
    if row.selection.startswith("rerank@"):
        return f"- {row.stage}: {k} attempts per task, the value model picks the one that counts"
    return f"- {row.stage}: {k} attempts per task, the first one counts"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{low:.3f}, {high:.3f}] "


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
