"""The run's results table: a row per stage, replaced in place when a stage is evaluated again; JSON and Markdown."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.heldout import EpisodeResult, HeldoutResult, TaskResult
from orchard.evaluation.results import StageRow, read_rows, record_stage
from orchard.evaluation.stats import mean_stats, success_stats


def result(stage: str, successes: list[bool], wall_time_s: float = 10.0, missing: int = 0) -> HeldoutResult:
    """A stage's result with reward = success, the last ``missing`` episodes without outcome."""
    episodes = [
        EpisodeResult(f"e{i}", f"t{i}", 0, "SUCCEEDED" if won else "FAILED", won, float(won))
        for i, won in enumerate(successes)
    ]
    for i in range(len(episodes) - missing, len(episodes)):
        episodes[i] = EpisodeResult(f"e{i}", f"t{i}", 0)
    return HeldoutResult(
        stage=stage,
        run_id="run",
        samples_per_task=1,
        tasks=[TaskResult(e.task_id, [e], e) for e in episodes],
        success=success_stats(sum(e.success for e in episodes), len(episodes)),
        reward=mean_stats([e.reward for e in episodes]),
        wall_time_s=wall_time_s,
        mean_success=0.0,
        any_success=0.0,
        missing=[e.episode_id for e in episodes if not e.finished],
    )


def test_a_stage_row_holds_counts_rate_wilson_interval_reward_and_wall_time(tmp_path: Path) -> None:
    rows = record_stage(tmp_path, result("sft", [True, True, True, False], wall_time_s=12.5))

    row = rows[0]
    assert (row.stage, row.tasks, row.successes, row.success_rate, row.wall_time_s) == ("sft", 4, 3, 0.75, 12.5)
    assert (round(row.success_ci_low, 4), round(row.success_ci_high, 4)) == (0.3006, 0.9544)
    assert row.mean_reward == 0.75
    assert (round(row.reward_ci_low or 0, 4), round(row.reward_ci_high or 0, 4)) == (0.26, 1.24)


def test_recording_a_stage_again_replaces_its_row_in_place_and_new_stages_append(tmp_path: Path) -> None:
    record_stage(tmp_path, result("base", [False, False]))
    record_stage(tmp_path, result("sft", [True, False]))
    record_stage(tmp_path, result("rl", [True, True]))
    json_before = (tmp_path / "results.json").read_text()
    record_stage(tmp_path, result("sft", [True, True, False, True], missing=1))

    rows = read_rows(tmp_path)
    assert [(r.stage, r.tasks, r.successes, r.missing) for r in rows] == [
        ("base", 2, 0, 0), ("sft", 4, 2, 1), ("rl", 2, 2, 0),
    ]  # fmt: skip
    assert (tmp_path / "results.json").read_text() != json_before
    twice = [replace(r, evaluated_at="") for r in rows]
    record_stage(tmp_path, result("sft", [True, True, False, True], missing=1))
    assert [replace(r, evaluated_at="") for r in read_rows(tmp_path)] == twice


def test_json_and_markdown_hold_the_same_rows(tmp_path: Path) -> None:
    record_stage(tmp_path, result("base", [False, False, False, False], wall_time_s=3.25))
    record_stage(tmp_path, result("sft", [True, True, False, True], wall_time_s=12.5, missing=1))

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["format"] == 1
    assert [(s["stage"], s["tasks"], s["successes"], s["success_rate"]) for s in data["stages"]] == [
        ("base", 4, 0, 0.0), ("sft", 4, 2, 0.5),
    ]  # fmt: skip
    assert set(data["stages"][0]) == {field for field in StageRow.__dataclass_fields__}
    assert (tmp_path / "results.md").read_text() == (
        "| stage | tasks | success rate | 95% CI | mean reward [95% CI] | wall time (s) |\n"
        "|---|---:|---:|---:|---:|---:|\n"
        "| base | 4 | 0.0% (0/4) | [0.0%, 49.0%] | 0.000 [0.000, 0.000] | 3.2 |\n"
        "| sft | 4 | 50.0% (2/4) | [15.0%, 85.0%] | 0.500 [-0.066, 1.066] | 12.5 |\n"
        "\n"
        "- sft: 1 episode(s) without outcome, counted as failures\n"
    )
    detail = json.loads((tmp_path / "eval" / "sft.json").read_text())
    assert [t["task_id"] for t in detail["tasks"]] == ["t0", "t1", "t2", "t3"]
    assert detail["missing"] == ["e3"]


def test_a_corrupt_table_is_reported_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text("{not json")

    with pytest.raises(ResultsError, match="cannot read"):
        record_stage(tmp_path, result("sft", [True]))
    assert (tmp_path / "results.json").read_text() == "{not json"


def test_stage_results_read_with_unknown_fields_from_a_newer_writer(tmp_path: Path) -> None:
    record_stage(tmp_path, result("sft", [True]))
    data = json.loads((tmp_path / "results.json").read_text())
    data["stages"][0]["future_field"] = 1
    (tmp_path / "results.json").write_text(json.dumps(data))

    assert [row.stage for row in read_rows(tmp_path)] == ["sft"]
