"""The rule-based process reward on hand-made trajectories gives the documented score per step."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import consumers.dense  # noqa: F401 - registers the plug-ins by name
from consumers.dense.process_reward import RuleProcessReward
from consumers.rewards import load_reward, step_score_record
from orchard.exceptions import ConfigError
from orchard.trajectory import Step, Trajectory

SYSTEM = {"role": "system", "content": "You are an autonomous software agent."}
TASK = {"role": "user", "content": "Fix the parser bug."}


def shell(command: str | list[str], tool: str = "shell") -> dict[str, Any]:
    return {"name": tool, "arguments": json.dumps({"command": command})}


def submit() -> dict[str, Any]:
    return {"name": "submit", "arguments": json.dumps({"summary": "fixed"})}


def trajectory(turns: list[tuple[dict[str, Any] | str | None, dict[str, Any] | None]]) -> Trajectory:
    """Built-in-agent style: each turn is (one tool call, or reply text, or None) and the tool's JSON result."""
    messages: list[Any] = [SYSTEM, TASK]
    steps = []
    for index, (action, result) in enumerate(turns):
        calls = []
        if isinstance(action, dict):
            calls = [{"id": f"call_{index}", "type": "function", "function": action}]
        text = action if isinstance(action, str) else ""
        steps.append(
            Step(
                call_index=index,
                conversation_id=0,
                policy_version=3,
                prompt_token_ids=np.array([1, 2, 3], dtype=np.int32),
                completion_token_ids=np.array([4, 5], dtype=np.int32),
                completion_logprobs=np.array([-0.1, -0.2], dtype=np.float32),
                request_messages=list(messages),
                response_text=text,
                response_tool_calls=calls,
                finish_reason="tool_calls" if calls else "stop",
            )
        )
        messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        if calls and result is not None:
            messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": json.dumps(result)})
    return Trajectory(run_id="r", episode_id="e1", task_id="t", group_id="g", steps=tuple(steps))


def scored(plugin: RuleProcessReward, turns: list[Any]) -> list[tuple[float, list[str]]]:
    return [(score.score, list(score.details["rules"])) for score in plugin.score_episode(trajectory(turns))]


OK = {"exit_code": 0, "output": "1 passed in 0.01s"}
FAILING = {"exit_code": 1, "output": "FAILED tests/test_parser.py::test_empty - IndexError"}
QUIET = {"exit_code": 0, "output": ""}


def test_writing_a_test_reproducing_fixing_and_verifying_earn_the_documented_scores() -> None:
    turns = [
        (shell("cat src/parser.py"), QUIET),
        (shell("cat > tests/test_parser.py <<'EOF'\ndef test_empty():\n    assert parse('') == []\nEOF"), QUIET),
        (shell("pytest -x tests/test_parser.py"), FAILING),
        (shell("sed -i 's/lines\\[0\\]/lines/' src/parser.py"), QUIET),
        (shell("pytest -x tests/test_parser.py"), OK),
        (submit(), {"status": "submitted"}),
    ]
    assert scored(RuleProcessReward(), turns) == [
        (0.0, []),
        (0.5, ["write_test"]),
        (0.25, ["run_tests"]),
        (0.0, []),
        (1.5, ["verify_fix", "fix_passes"]),
        (0.0, []),
    ]


def test_repeated_commands_and_steps_that_do_nothing_are_penalised() -> None:
    turns = [
        (shell("ls -la src/"), QUIET),
        (shell("ls  -la src/"), QUIET),  # the same command (whitespace aside), nothing changed in between
        ("Let me think about this.", None),  # no action
        ({"name": "shell", "arguments": "{not json"}, {"error": "invalid arguments"}),  # malformed call
        (shell(""), QUIET),  # empty command
        ("The bug is fixed.", None),  # the final answer: exempt
    ]
    assert scored(RuleProcessReward(), turns) == [
        (0.0, []),
        (-0.5, ["repeat"]),
        (-0.25, ["no_op"]),
        (-0.25, ["no_op"]),
        (-0.25, ["no_op"]),
        (0.0, []),
    ]


def test_the_same_test_run_after_an_edit_is_a_verification_not_a_repeat() -> None:
    turns = [
        (shell("pytest -q"), FAILING),
        (shell("pytest -q"), FAILING),  # nothing changed: a loop
        (shell("sed -i 's/a/b/' src/parser.py"), QUIET),
        (shell("pytest -q"), FAILING),  # verifies the edit (which does not pass yet)
        (shell("pytest -q"), FAILING),  # a loop again
    ]
    assert scored(RuleProcessReward(), turns) == [
        (0.25, ["run_tests"]),
        (-0.5, ["repeat"]),
        (0.0, []),
        (1.0, ["verify_fix"]),
        (-0.5, ["repeat"]),
    ]


def test_codex_argv_commands_and_text_harness_blocks_are_read() -> None:
    turns = [
        (shell(["bash", "-lc", "python -m pytest tests"], tool="exec_command"), QUIET),
        ("I will reproduce it first.\n```bash\nprintf 'x' > repro_test.py\n```", None),
    ]
    assert scored(RuleProcessReward(), turns) == [(0.25, ["run_tests"]), (0.5, ["write_test"])]


def test_score_step_agrees_with_score_episode_and_makes_step_score_records() -> None:
    plugin = RuleProcessReward()
    episode = trajectory([(shell("pytest"), FAILING), (shell("pytest"), FAILING)])
    assert [plugin.score_step(step, episode) for step in episode.steps] == plugin.score_episode(episode)
    scores = plugin.score_episode(episode)
    record = step_score_record(episode, scores[1], plugin.scorer_name, timestamp_ms=7, episode_score_count=len(scores))
    assert record == {
        "run_id": "r",
        "episode_id": "e1",
        "call_index": 1,
        "scorer": "rule_process_reward",
        "policy_version": 3,
        "token_start": None,
        "token_end": None,
        "score": -0.5,
        "details_json": '{"rules": ["repeat"]}',
        "episode_score_count": 2,
        "timestamp": 7,
    }


def test_weights_come_from_the_environment_and_keyword_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_RULE_PRM_RUN_TESTS", "2.0")
    monkeypatch.setenv("ORCHARD_RULE_PRM_REPEAT", "-3")
    loaded = load_reward("rule_process_reward")
    assert isinstance(loaded, RuleProcessReward)
    assert (loaded.settings.run_tests, loaded.settings.repeat) == (2.0, -3.0)
    assert RuleProcessReward(repeat=-1.0).settings.repeat == -1.0
    monkeypatch.setenv("ORCHARD_RULE_PRM_NO_OP", "lots")
    with pytest.raises(ConfigError, match="ORCHARD_RULE_PRM_NO_OP"):
        RuleProcessReward()
