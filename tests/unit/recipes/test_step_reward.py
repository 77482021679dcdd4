"""The file-lookup dense reward scores each call by the documented rules, from the episode's own record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from consumers.config import ConsumersConfig
from consumers.credit import CreditConfig, assign_credit
from consumers.rewards import load_reward
from orchard.config import OrchardConfig
from orchard.trajectory import Step, Trajectory
from recipes.file_lookup.step_reward import RULE_WEIGHTS, FileLookupSteps

SYSTEM = {"role": "system", "content": "You are an autonomous software agent working in a Unix shell."}
TASK = {"role": "user", "content": "Write the value of x in hen.txt to answer.txt."}
HEN = {"exit_code": 0, "output": "z: 885\nx: 295\n"}
COW = {"exit_code": 0, "output": "x: 622\ny: 406\n"}
QUIET = {"exit_code": 0, "output": ""}
TWO_HOP = {"role": "user", "content": "Write the value of x in the file named in index.txt to answer.txt."}
INDEX = {"exit_code": 0, "output": "file: hen.txt\n"}
SUBMITTED = {"status": "submitted"}


def shell(command: str) -> dict[str, Any]:
    return {"name": "shell", "arguments": json.dumps({"command": command})}


def submit() -> dict[str, Any]:
    return {"name": "submit", "arguments": json.dumps({"summary": "done"})}


def trajectory(
    turns: list[tuple[dict[str, Any] | str, dict[str, Any] | None]], task: dict[str, Any] = TASK
) -> Trajectory:
    """Built-in-agent style: each turn is one tool call (or reply text) and the tool's JSON result."""
    messages: list[Any] = [SYSTEM, task]
    steps = []
    for index, (action, result) in enumerate(turns):
        calls = [{"id": f"call_{index}", "type": "function", "function": action}] if isinstance(action, dict) else []
        text = action if isinstance(action, str) else ""
        steps.append(
            Step(
                call_index=index, conversation_id=0, policy_version=1,
                prompt_token_ids=np.array([1, 2], dtype=np.int32), completion_token_ids=np.array([3], dtype=np.int32),
                completion_logprobs=np.array([-0.5], dtype=np.float32), request_messages=list(messages),
                response_text=text, response_tool_calls=calls, finish_reason="tool_calls" if calls else "stop",
            )
        )  # fmt: skip
        messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        if calls and result is not None:
            messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": json.dumps(result)})
    return Trajectory(run_id="r", episode_id="e", task_id="t", group_id="g", steps=tuple(steps))


def scored(
    turns: list[Any], plugin: FileLookupSteps | None = None, task: dict[str, Any] = TASK
) -> list[tuple[float, list[str]]]:
    plugin = plugin or FileLookupSteps()
    return [(score.score, list(score.details["rules"])) for score in plugin.score_episode(trajectory(turns, task))]


def test_the_expert_path_earns_a_read_and_an_observed_write() -> None:
    turns = [(shell("cat hen.txt"), HEN), (shell("echo 295 > answer.txt"), QUIET), (submit(), SUBMITTED)]
    assert scored(turns) == [(0.5, ["read_target"]), (0.5, ["write_observed"]), (0.0, [])]


def test_a_detour_a_wrong_line_and_a_repeat_are_penalised() -> None:
    turns = [
        (shell("cat cow.txt"), COW),
        (shell("cat hen.txt"), HEN),
        (shell("cat  hen.txt"), HEN),  # the same command, whitespace aside
        (shell("echo 885 > answer.txt"), QUIET),  # z's value, not x's
        (submit(), SUBMITTED),
    ]
    assert scored(turns) == [(-0.1, ["read_other"]), (0.5, ["read_target"]), (-0.25, ["repeat"]),
                             (-0.25, ["write_wrong"]), (0.0, [])]  # fmt: skip


def test_a_guess_before_reading_is_wrong_even_when_it_is_the_value() -> None:
    """Only what the named file printed counts: writing the right number unseen is not rewarded as a lookup."""
    turns = [(shell("echo 295 > answer.txt"), QUIET), (submit(), SUBMITTED)]
    assert scored(turns) == [(-0.25, ["write_wrong"]), (0.0, [])]


def test_the_value_another_file_printed_for_the_key_is_wrong() -> None:
    turns = [(shell("cat cow.txt"), COW), (shell("echo 622 > answer.txt"), QUIET), (submit(), SUBMITTED)]
    assert scored(turns) == [(-0.1, ["read_other"]), (-0.25, ["write_wrong"]), (0.0, [])]


def test_submitting_before_writing_and_calls_without_tools_are_penalised() -> None:
    turns = [("I do not know.", None), (shell("cat hen.txt"), HEN), (submit(), SUBMITTED)]
    assert scored(turns) == [(-0.25, ["no_op"]), (0.5, ["read_target"]), (-0.5, ["submit_early"])]


def test_weights_can_be_overridden_per_rule_and_unknown_rules_are_refused() -> None:
    turns = [(shell("cat hen.txt"), HEN), (shell("echo 295 > answer.txt"), QUIET), (submit(), SUBMITTED)]
    assert scored(turns, FileLookupSteps({"read_target": 1.0})) == [(1.0, ["read_target"]),
                                                                     (0.5, ["write_observed"]), (0.0, [])]  # fmt: skip
    with pytest.raises(ValueError, match="read_the_file"):
        FileLookupSteps({"read_the_file": 1.0})
    assert set(RULE_WEIGHTS) >= {"read_target", "write_observed", "write_wrong", "repeat", "submit_early", "no_op"}


def test_the_plug_in_loads_by_module_path_as_orchard_consumer_run_does() -> None:
    plugin = load_reward("recipes.file_lookup.step_reward:FileLookupSteps")
    assert plugin.scorer_name == "file_lookup_steps"


# ---------------------------------------------------------------------------------------------------- two hops
def test_the_two_hop_expert_path_earns_an_index_read_a_read_and_an_observed_write() -> None:
    turns = [
        (shell("cat index.txt"), INDEX),
        (shell("cat hen.txt"), HEN),
        (shell("echo 295 > answer.txt"), QUIET),
        (submit(), SUBMITTED),
    ]
    assert scored(turns, task=TWO_HOP) == [(0.4, ["read_index"]), (0.5, ["read_target"]), (0.5, ["write_observed"]),
                                           (0.0, [])]  # fmt: skip


def test_reading_the_named_file_before_the_index_is_a_target_read_and_guessing_first_never_pays_more() -> None:
    lucky = [(shell("cat hen.txt"), HEN), (shell("cat index.txt"), INDEX), (shell("echo 295 > answer.txt"), QUIET)]
    assert scored(lucky, task=TWO_HOP) == [(0.5, ["read_target"]), (0.4, ["read_index"]), (0.5, ["write_observed"])]
    unlucky = [
        (shell("cat cow.txt"), COW),
        *[(shell(c), r) for c, r in (("cat index.txt", INDEX), ("cat hen.txt", HEN))],
    ]
    assert scored(unlucky, task=TWO_HOP) == [(-0.1, ["read_other"]), (0.4, ["read_index"]), (0.5, ["read_target"])]


def test_without_reading_the_index_every_read_is_a_detour_and_every_write_a_guess() -> None:
    turns = [(shell("cat hen.txt"), HEN), (shell("echo 295 > answer.txt"), QUIET), (submit(), SUBMITTED)]
    assert scored(turns, task=TWO_HOP) == [(-0.1, ["read_other"]), (-0.25, ["write_wrong"]), (0.0, [])]


def test_rewriting_the_index_before_reading_it_leaves_the_named_file_unknown() -> None:
    """What a rewritten index prints is the agent's own word: following it earns no read and no observed write."""
    turns = [
        (shell("echo file: cow.txt > index.txt"), QUIET),
        (shell("cat index.txt"), {"exit_code": 0, "output": "file: cow.txt\n"}),
        (shell("cat cow.txt"), COW),
        (shell("echo 622 > answer.txt"), QUIET),
    ]
    assert scored(turns, task=TWO_HOP) == [(0.0, []), (0.4, ["read_index"]), (-0.1, ["read_other"]),
                                           (-0.25, ["write_wrong"])]  # fmt: skip


@pytest.mark.parametrize(
    "rewrite", ["echo file: cow.txt > inde?.txt", "echo file: cow.txt > ind''ex.txt", "sed -i s/hen/cow/ *.txt",
                "mv cow.txt hen.txt"],
)  # fmt: skip
def test_rewriting_the_index_without_naming_it_also_leaves_the_named_file_unknown(rewrite: str) -> None:
    """Any command but a plain read before the index read makes what it prints the agent's own word."""
    turns = [
        (shell(rewrite), QUIET),
        (shell("cat index.txt"), {"exit_code": 0, "output": "file: cow.txt\n"}),
        (shell("cat cow.txt"), COW),
        (shell("echo 622 > answer.txt"), QUIET),
    ]
    rules = [rule for _, found in scored(turns, task=TWO_HOP) for rule in found]
    assert "read_target" not in rules and "write_observed" not in rules


def test_plain_reads_and_listings_before_the_index_keep_the_named_file_known() -> None:
    turns = [
        (shell("ls"), {"exit_code": 0, "output": "cow.txt\nhen.txt\nindex.txt\n"}),
        (shell("cat cow.txt"), COW),
        (shell("cat index.txt"), INDEX),
        (shell("cat hen.txt"), HEN),
        (shell("echo 295 > answer.txt"), QUIET),
    ]
    rules = [rule for _, found in scored(turns, task=TWO_HOP) for rule in found]
    assert {"read_index", "read_target", "write_observed"} <= set(rules)


def test_in_a_one_hop_task_reading_an_index_is_a_detour() -> None:
    turns = [(shell("cat index.txt"), {"exit_code": 1, "output": "cat: index.txt: No such file or directory"})]
    assert scored(turns) == [(-0.1, ["read_other"])]


def _recipe_credit_config(monkeypatch: pytest.MonkeyPatch) -> CreditConfig:
    """The credit rules the recipe's credit-assignment builder runs with (its environment, as the CLI reads it)."""
    recipe = yaml.safe_load((Path(__file__).parents[3] / "recipes/file_lookup/recipe.yaml").read_text())
    for name, value in recipe["components"]["builder-credit"]["env"].items():
        monkeypatch.setenv(name, value)
    return ConsumersConfig.model_validate(OrchardConfig().consumers).sample_builder.credit


@pytest.mark.parametrize(
    ("turns", "weights"),
    [
        # wrong_file: another file read, its value written: nothing in it is the named file's value
        ([(shell("cat cow.txt"), COW), (shell("echo 622 > answer.txt"), QUIET), (submit(), SUBMITTED)], [0, 0, 0]),
        # no_read: a guess written without reading anything
        ([(shell("echo 731 > answer.txt"), QUIET), (submit(), SUBMITTED)], [0, 0]),
        # the named file read, then a wrong line written: the read is the productive fragment
        ([(shell("cat hen.txt"), HEN), (shell("echo 885 > answer.txt"), QUIET), (submit(), SUBMITTED)],
         [0.5 * 0.6, 0, 0]),
    ],
)  # fmt: skip
def test_the_recipes_credit_stage_trains_on_a_failed_attempts_read_of_the_named_file_and_never_on_a_wrong_write(
    monkeypatch: pytest.MonkeyPatch, turns: list[Any], weights: list[float]
) -> None:
    config = _recipe_credit_config(monkeypatch)
    failed = dataclasses.replace(trajectory(turns), status="FAILED", success=False, signals={"progress": 0.2})
    scores = {"file_lookup_steps": {s.call_index: s.score for s in FileLookupSteps().score_episode(failed)}}
    credit = assign_credit(failed, config, step_scores=scores)
    assert [c.weight for c in credit] == pytest.approx(weights)
    without_scores = assign_credit(failed, CreditConfig(progress_signals=["progress"]))
    assert max(c.weight for c in without_scores) == pytest.approx(0.25 * 0.6), "the coding rules credit the write"


def test_the_recipes_credit_builder_joins_a_demonstrations_scores_read_after_much_later_trajectories(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The credit stage reads every trajectory from the start: held-out ones, minutes newer than the
    demonstrations, move the builder's event-time clock before a demonstration's scores are read."""
    from tests.unit.consumers.test_samples import arrays, drive, episode, score

    _recipe_credit_config(monkeypatch)  # the builder-credit environment
    config = ConsumersConfig.model_validate(OrchardConfig().consumers).sample_builder
    demo = episode("demo", reward=0.0, group="g-demo", timestamp=1_000, first_command="cat hen.txt",
                   signals={"progress": 0.2})  # fmt: skip
    held_out = episode("eval", reward=1.0, status="SUCCEEDED", group="g-eval", timestamp=1_000 + 8 * 60_000)
    scored = [score("demo", "file_lookup_steps", 0, 0.5, 1_001, count=2),
              score("demo", "file_lookup_steps", 1, 0.0, 1_001, count=2)]  # fmt: skip
    out, _ = drive(config, [demo, held_out, *scored])
    samples = {sample["episode_id"]: arrays(sample)[2] for sample in out}
    assert samples["demo"] == [0, 0, 0, 0.3, 0.3, 0, 0, 0, 0, 0]  # the read's 0.5, times the progress factor 0.6
