"""The viewer's pure parts: filters, stage placement, rolling means, trainer-loss thinning, JSON-safe values, and
the doctests of its modules."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchard.viewer import curves, filters, runfiles, values
from orchard.viewer.exceptions import BadQueryError
from orchard.viewer.filters import EpisodeFilter
from orchard.viewer.runfiles import RunFiles, Stage, stage_at
from orchard.viewer.tokens import TokenText


def row(**fields: Any) -> dict[str, Any]:
    base = {"run_id": "r", "task_id": "t", "status": "FAILED", "policy_version": 1, "stage": "rl", "eval": False,
            "reward": 0.5}  # fmt: skip
    return base | fields


@pytest.mark.parametrize("module", [curves, filters, runfiles, values])
def test_the_doctests_hold(module: ModuleType) -> None:
    outcome = doctest.testmod(module, raise_on_error=False)
    assert (outcome.failed, outcome.attempted > 0) == (0, True)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (EpisodeFilter(), True),
        (EpisodeFilter(task="t", status="FAILED", stage="rl", policy_version=1, run="r"), True),
        (EpisodeFilter(task="u"), False),
        (EpisodeFilter(policy_version=0), False),
        (EpisodeFilter(stage="-"), False),
        (EpisodeFilter(kind="eval"), False),
        (EpisodeFilter(kind="train"), True),
        (EpisodeFilter(reward_min=0.5, reward_max=0.5), True),
        (EpisodeFilter(reward_min=0.6), False),
    ],
)
def test_a_filter_passes_exactly_the_rows_it_describes(selection: EpisodeFilter, expected: bool) -> None:
    assert selection.matches(row()) is expected


def test_rows_outside_stages_match_the_no_stage_filter_and_rows_without_reward_no_reward_bound() -> None:
    outside = row(stage=None, reward=None)
    assert (EpisodeFilter(stage="-").matches(outside), EpisodeFilter(reward_max=1.0).matches(outside)) == (True, False)


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (EpisodeFilter(status="done"), "status 'done' is not one of SUCCEEDED, FAILED"),
        (EpisodeFilter(stage="ppo"), "stage 'ppo' is not a stage of this run (sft, -)"),
        (EpisodeFilter(reward_min=2.0, reward_max=1.0), "reward_min 2.0 is above reward_max 1.0"),
    ],
)
def test_a_filter_value_that_cannot_match_is_refused_with_its_reason(selection: EpisodeFilter, message: str) -> None:
    with pytest.raises(BadQueryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        selection.check(["sft"])


def test_an_episode_belongs_to_the_latest_stage_whose_span_holds_its_end() -> None:
    stages = [Stage("sft", "", "completed", 0, 100), Stage("eval", "", "completed", 50, 80),
              Stage("rl", "", "running", 100, None), Stage("later", "", "pending", None, None)]  # fmt: skip
    assert [stage_at(stages, t) for t in (-1, 10, 60, 90, 100, 10_000, None)] == [
        None, "sft", "eval", "sft", "rl", "rl", None,
    ]  # fmt: skip


def test_run_files_tolerate_absent_and_half_written_files(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert (files.stages(), files.heldout(), files.trainer_loss(), files.recipe_model()) == ([], [], {}, None)
    (tmp_path / "state.json").write_text('{"stages": [')
    (tmp_path / "results.json").write_text("{}")
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5, "time": 2.0}) + '\n{"st')
    (tmp_path / "recipe.yaml").write_text("model: tiny-qwen\n")
    assert (files.stages(), files.heldout(), files.trainer_loss(), files.recipe_model()) == (
        [], [], {"policy": [{"time": 2000.0, "step": 1.0, "loss": 0.5}]}, "tiny-qwen",
    )  # fmt: skip


def test_tokens_are_text_only_for_a_tiny_model_unless_told() -> None:
    modes = [
        TokenText.for_run(mode, model).mode
        for mode, model in (
            ("auto", "tiny-llama"),
            ("auto", "/ckpt/qwen"),
            ("auto", None),
            ("tiny", None),
            ("ids", "tiny-llama"),
        )
    ]
    assert modes == ["tiny", "ids", "ids", "tiny", "ids"]
    assert TokenText("ids").texts([1, 2]) is None


def test_non_finite_values_reach_json_as_null() -> None:
    assert values.finite_list([1.0, float("nan"), float("inf"), -2]) == [1.0, None, None, -2.0]
