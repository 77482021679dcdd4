"""The run's results table: a row per stage, replaced in place when a stage is evaluated again; JSON and Markdown;
rows saying how their figure was obtained (selection) and what it cost, older tables still readable; a stage's
detail in JSON and Markdown (summary, breakdown, cost)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchard.evaluation.cost import TokenCount
from orchard.evaluation.environment import describe, software_environment
from orchard.evaluation.exceptions import ResultsError
from orchard.evaluation.heldout import (
    EpisodeResult,
    HeldoutConfig,
    HeldoutResult,
    TaskResult,
    first_success,
    plan_episodes,
    summarise,
)
from orchard.evaluation.results import StageRow, read_rows, record_stage, render_markdown
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
        mean_success=sum(e.success for e in episodes) / len(episodes),
        any_success=sum(e.success for e in episodes) / len(episodes),
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
        "| stage | selection | tasks | success rate | 95% CI | vs previous: wins/losses | exact p | pass@1 "
        "| mean reward [95% CI] | model calls | tokens | wall time (s) |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| base | first | 4 | 0.0% (0/4) | [0.0%, 49.0%] | - | - | 0.0% | 0.000 [0.000, 0.000] | - | - | 3.2 |\n"
        "| sft | first | 4 | 50.0% (2/4) | [15.0%, 85.0%] | +2/-0 of 4 | 0.500 | 50.0% | 0.500 [-0.066, 1.066] "
        "| - | - | 12.5 |\n"
        "\n"
        "- sft: 1 episode(s) without outcome, counted as failures\n"
        "- vs previous: tasks this stage solves and the stage above fails (wins) / the reverse (losses), on the "
        "tasks both evaluated; exact p: two-sided exact McNemar test (binomial on the discordant pairs)\n"
        f"- measured with {describe(software_environment())}\n"
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


def pass_at_2(outcome: Callable[..., dict[str, Any]], tokens: TokenCount | None) -> HeldoutResult:
    """Stage ``pass2``: tasks a (attempts fail, win), b (fail, fail), c (win, fail); labels repo x, x, y."""
    config = HeldoutConfig(run_id="run", stage="pass2", harness="builtin", model="m", samples_per_task=2,
                           selection="pass", by=["repo"])  # fmt: skip
    requests = plan_episodes(config, ["a", "b", "c"])
    wins = [False, True, False, False, True, False]
    outcomes = {
        r.episode_id: outcome(r.episode_id, task_id=r.task_id, success=won, reward=float(won), ended_at=1_000_000 + i)
        for i, (r, won) in enumerate(zip(requests, wins, strict=True))
    }
    labels = {"a": {"repo": "x"}, "b": {"repo": "x"}, "c": {"repo": "y"}}
    return summarise(config, requests, outcomes, first_success, 7.25, labels=labels, tokens=tokens)


def test_a_pass_at_k_row_says_how_it_was_obtained_and_what_it_cost(
    tmp_path: Path, outcome: Callable[..., dict[str, Any]]
) -> None:
    rows = record_stage(tmp_path, pass_at_2(outcome, TokenCount(calls=18, prompt_tokens=1200, completion_tokens=34)))

    row = rows[0]
    assert (row.selection, row.samples_per_task, row.successes, row.pass_at_1) == ("pass@2", 2, 2, 2 / 6)
    assert (row.model_calls, row.calls_read, row.prompt_tokens, row.completion_tokens) == (18, 18, 1200, 34)
    assert row.episode_time_s == 6.0
    assert render_markdown([replace(row, environment=None)]).splitlines()[2:] == [
        "| pass2 | pass@2 | 3 | 66.7% (2/3) | [20.8%, 93.9%] | - | - | 33.3% | 0.667 [0.013, 1.320] | 18 | 1,234 "
        "| 7.2 |",
        "",
        "- pass2: 2 attempts per task, solved when any succeeds (pass@2); pass@1 over all attempts",
    ]
    partial = replace(row, calls_read=10, environment=None)
    assert render_markdown([partial]).splitlines()[-1] == (
        "- pass2: tokens of 10 of 18 model calls only (the rest not read in time)"
    )


def test_a_stage_detail_markdown_has_the_summary_the_breakdown_and_the_cost(
    tmp_path: Path, outcome: Callable[..., dict[str, Any]]
) -> None:
    record_stage(tmp_path, pass_at_2(outcome, TokenCount(calls=18, prompt_tokens=1200, completion_tokens=34)))

    assert (tmp_path / "eval" / "pass2.md").read_text() == (
        "# Evaluation of stage pass2\n"
        "\n"
        "| | |\n"
        "|---|---|\n"
        "| run | run |\n"
        "| selection | pass@2: 2 attempts per task, solved when any attempt succeeds |\n"
        "| success | 66.7% (2/3), 95% CI [20.8%, 93.9%] |\n"
        "| pass@1 | 33.3% (mean over 6 attempts) |\n"
        "| pass@2 | 66.7% |\n"
        "| mean reward | 0.667 [0.013, 1.320] (normal 95% CI) |\n"
        "| wall time | 7.2 s |\n"
        "\n"
        "## By repo\n"
        "\n"
        "| repo | tasks | success rate | 95% CI | pass@1 |\n"
        "|---|---:|---:|---:|---:|\n"
        "| x | 2 | 50.0% (1/2) | [9.5%, 90.5%] | 25.0% |\n"
        "| y | 1 | 100.0% (1/1) | [20.7%, 100.0%] | 50.0% |\n"
        "\n"
        "## Cost\n"
        "\n"
        "| model calls | prompt tokens | completion tokens | tokens | wall time (s) | episode time (s) "
        "| mean episode (s) |\n"
        "|---:|---:|---:|---:|---:|---:|---:|\n"
        "| 18 | 1,200 | 34 | 1,234 | 7.2 | 6.0 | 1.0 |\n"
    )
    detail = json.loads((tmp_path / "eval" / "pass2.json").read_text())
    assert [(t["task_id"], t["labels"], t["chosen"][-1]) for t in detail["tasks"]] == [
        ("a", {"repo": "x"}, "1"), ("b", {"repo": "x"}, "0"), ("c", {"repo": "y"}, "0"),
    ]  # fmt: skip
    assert [(g["value"], g["successes"], g["tasks"]) for g in detail["breakdown"]["repo"]] == [("x", 1, 2), ("y", 1, 1)]
    assert (detail["cost"]["total_tokens"], detail["cost"]["tokens_complete"]) == (1234, True)


def test_uncounted_tokens_are_said_so_in_the_stage_detail(
    tmp_path: Path, outcome: Callable[..., dict[str, Any]]
) -> None:
    record_stage(tmp_path, pass_at_2(outcome, None))

    report = (tmp_path / "eval" / "pass2.md").read_text()
    assert report.endswith("| 18 | - | - | - | 7.2 | 6.0 | 1.0 |\n\nTokens not counted.\n")
    assert read_rows(tmp_path)[0].total_tokens is None


def test_rows_of_an_older_table_read_back_with_their_selection_inferred_and_unknown_cost(tmp_path: Path) -> None:
    old = {"stage": "base", "tasks": 2, "successes": 1, "success_rate": 0.5, "success_ci_low": 0.1,
           "success_ci_high": 0.9, "mean_reward": 0.5, "reward_ci_low": None, "reward_ci_high": None,
           "wall_time_s": 3.0, "samples_per_task": 1, "missing": 0, "evaluated_at": "2026-11-01T00:00:00Z"}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"format": 1, "stages": [old, old | {"stage": "rerank",
                                                       "samples_per_task": 4}]}))  # fmt: skip

    rows = read_rows(tmp_path)

    assert [(r.stage, r.selection, r.pass_at_1, r.model_calls, r.total_tokens) for r in rows] == [
        ("base", "first", None, None, None), ("rerank", "rerank@4", None, None, None),
    ]  # fmt: skip
    assert render_markdown(rows).splitlines()[2:] == [
        "| base | first | 2 | 50.0% (1/2) | [10.0%, 90.0%] | - | - | - | 0.500 | - | - | 3.0 |",
        "| rerank | rerank@4 | 2 | 50.0% (1/2) | [10.0%, 90.0%] | - | - | - | 0.500 | - | - | 3.0 |",
        "",
        "- rerank: 4 attempts per task, the value model picks the one that counts",
    ]
    record_stage(tmp_path, result("sft", [True]))
    assert [r.stage for r in read_rows(tmp_path)] == ["base", "rerank", "sft"]
    assert read_rows(tmp_path)[1] == rows[1]
