"""The reward plug-in API: hooks cascade, plain functions work, plug-ins load by name or path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from consumers.rewards import (
    FunctionReward,
    RewardPlugin,
    RewardPluginError,
    Score,
    load_reward,
    register_reward,
    step_score_record,
)
from orchard.trajectory import Step, Trajectory


def _step(index: int, text: str) -> Step:
    return Step(
        call_index=index, conversation_id=0, policy_version=7 + index, prompt_token_ids=np.arange(3, dtype=np.int32),
        completion_token_ids=np.arange(4, dtype=np.int32), completion_logprobs=np.zeros(4, dtype=np.float32),
        request_messages=[], response_text=text, response_tool_calls=[], finish_reason="stop",
    )  # fmt: skip


TRAJECTORY = Trajectory(
    run_id="r", episode_id="e", task_id="t", group_id="g", steps=(_step(0, "run pytest"), _step(1, "done"))
)


class RanTheTests(RewardPlugin):
    """Scores a step 1 when it mentions pytest, abstains otherwise."""

    def score_step(self, step: Step, trajectory: Trajectory) -> float | None:
        return 1.0 if "pytest" in step.response_text else None


def long_answers(step: Step, trajectory: Trajectory) -> Score:
    """A plain-function plug-in returning a token-span score."""
    return Score(step.call_index, 0.5, token_start=0, token_end=2, details={"why": "test"})


def test_step_hook_results_cascade_to_episode_and_group_scores() -> None:
    plugin = RanTheTests()
    assert plugin.scorer_name == "ran_the_tests"
    assert plugin.score_episode(TRAJECTORY) == [Score(0, 1.0)]
    assert plugin.score_group([TRAJECTORY]) == {"e": [Score(0, 1.0)]}


def test_plugins_load_from_a_module_path_as_class_or_function() -> None:
    assert isinstance(load_reward(f"{__name__}:RanTheTests"), RanTheTests)
    function_plugin = load_reward(f"{__name__}:long_answers")
    assert isinstance(function_plugin, FunctionReward) and function_plugin.scorer_name == "long_answers"
    assert function_plugin.score_episode(TRAJECTORY)[1].token_end == 2


def test_registered_names_load_and_duplicates_are_refused() -> None:
    register_reward("test-rewards-constant")(lambda step, trajectory: 0.0)
    assert load_reward("test-rewards-constant").score_episode(TRAJECTORY) == [Score(0, 0.0), Score(1, 0.0)]
    with pytest.raises(RewardPluginError, match="already registered"):
        register_reward("test-rewards-constant")(lambda step, trajectory: 1.0)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no-such-reward", "unknown reward plug-in 'no-such-reward'"),
        ("no_such_module_xyz:Reward", "cannot import module 'no_such_module_xyz'"),
        (f"{__name__}:Missing", "has no attribute 'Missing'"),
        (f"{__name__}:TRAJECTORY", "is not a RewardPlugin"),
    ],
)
def test_bad_plugin_specs_fail_with_a_clear_error(spec: str, message: str) -> None:
    with pytest.raises(RewardPluginError, match=message):
        load_reward(spec)


def test_step_score_records_carry_the_calls_policy_version_and_refuse_unknown_calls() -> None:
    record = step_score_record(TRAJECTORY, Score(1, math.nan, details={"a": 1}), "judge", 1234)
    assert record["policy_version"] == 8 and record["timestamp"] == 1234 and math.isnan(record["score"])
    assert record["details_json"] == '{"a": 1}'
    with pytest.raises(RewardPluginError, match="scored call 5"):
        step_score_record(TRAJECTORY, Score(5, 1.0), "judge", 0)


def test_a_list_with_something_other_than_scores_is_an_error() -> None:
    plugin = FunctionReward(lambda step, trajectory: [1.0], name="bad")
    with pytest.raises(RewardPluginError, match="expected Score objects"):
        plugin.score_episode(TRAJECTORY)
