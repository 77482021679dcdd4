"""Credit assignment on hand-made trajectories gives the weights the rules in ``consumers.credit`` document."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from consumers.actions import command_action, edited_paths, trajectory_actions
from consumers.credit import CreditConfig, CreditWeights, StepCredit, assign_credit, fix_files_of, step_facts
from orchard.trajectory import Step, Trajectory

# (tool call or None for a text reply, result the harness sent back, finish reason)
Turn = tuple[dict[str, Any] | None, str | None, str]


def shell(command: str) -> dict[str, Any]:
    """A built-in agent ``shell`` tool call (arguments as the API sends them: a JSON string)."""
    return {"type": "function", "function": {"name": "shell", "arguments": json.dumps({"command": command})}}


def result(exit_code: int, output: str = "") -> str:
    """The built-in agent's tool message content."""
    return json.dumps({"exit_code": exit_code, "output": output})


def agent_trajectory(
    turns: Sequence[Turn], *, status: str = "FAILED", signals: dict[str, float] | None = None, episode: str = "e"
) -> Trajectory:
    """A built-in-agent-like episode: each turn's tool result is a ``tool`` message in the next request."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "..."}, {"role": "user", "content": "fix"}]
    steps = []
    for index, (call, output, finish) in enumerate(turns):
        calls = [{**call, "id": f"call_{index}"}] if call is not None else []
        steps.append(
            Step(
                call_index=index,
                conversation_id=0,
                policy_version=1,
                prompt_token_ids=np.arange(3, dtype=np.int32),
                completion_token_ids=np.arange(2, dtype=np.int32),
                completion_logprobs=np.zeros(2, dtype=np.float32),
                request_messages=list(messages),
                response_text="",
                response_tool_calls=calls,
                finish_reason=finish,
            )  # fmt: skip
        )
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        if calls and output is not None:
            messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": output})
    return Trajectory(
        run_id="r", episode_id=episode, task_id="t", group_id="g", steps=tuple(steps), status=status,
        reward=1.0 if status == "SUCCEEDED" else 0.0, success=status == "SUCCEEDED", signals=signals or {},
    )  # fmt: skip


TRACEBACK = "Traceback (most recent call last):\n  File 'reproduce.py'\nAssertionError: 1 != 3"
TEST_FILE = "cat > tests/test_calc.py <<'EOF'\nfrom calc import add\ndef test_add():\n    assert add(1, 2) > 2\nEOF"
FAILED_ATTEMPT: list[Turn] = [
    (shell("ls"), result(0, "src tests"), "tool_calls"),  # 0 exploration: nothing
    (shell("cat src/calc.py"), result(0, "def add(a, b): return a - b"), "tool_calls"),  # 1 read the fix file
    (shell("python reproduce.py"), result(1, TRACEBACK), "tool_calls"),  # 2 reproduced the bug
    (shell("python  reproduce.py"), result(1, TRACEBACK), "tool_calls"),  # 3 the same again: repeated
    (shell(TEST_FILE), result(0), "tool_calls"),  # 4 wrote a test
    (shell("sed -i 's/a - b/a + b/' src/calc.py"), result(0), "tool_calls"),  # 5 edited the fix file
    (shell("python -m pytest -q tests/test_calc.py"), result(0, "1 passed"), "tool_calls"),  # 6 ran tests, verified
    ({"type": "function", "function": {"name": "shell", "arguments": "{not json"}}, None, "tool_calls"),  # 7 invalid
    (shell("pytest -q && git diff > /tmp/p"), None, "length"),  # 8 truncated by the length limit
    ({"type": "function", "function": {"name": "submit", "arguments": "{}"}}, None, "tool_calls"),  # 9 submit
]


def weights(credits: Sequence[StepCredit]) -> list[float]:
    return [round(credit.weight, 6) for credit in credits]


def test_a_failed_attempt_credits_its_productive_steps_scaled_by_partial_progress() -> None:
    trajectory = agent_trajectory(FAILED_ATTEMPT, signals={"tests_passed_fraction": 0.5})
    credits = assign_credit(trajectory, CreditConfig(), fix_files={"src/calc.py"})
    # progress 0.5 -> factor 0.5 + 0.5 * 0.5 = 0.75; reproduced, wrote_test, edited_fix_file, verified weigh 1.0
    assert weights(credits) == [0.0, 0.1875, 0.75, 0.0, 0.75, 0.75, 0.75, 0.0, 0.0, 0.0]
    assert [credit.tags for credit in credits] == [
        (), ("inspected_fix_file",), ("reproduced",), ("repeated",), ("wrote_test",), ("edited_fix_file",),
        ("ran_tests", "verified"), ("invalid",), ("truncated", "ran_tests"), (),
    ]  # fmt: skip


def test_without_a_successful_sibling_edits_are_plain_source_edits_and_reads_earn_nothing() -> None:
    trajectory = agent_trajectory(FAILED_ATTEMPT)  # no progress signal: factor = floor = 0.5
    credits = assign_credit(trajectory, CreditConfig())
    assert weights(credits) == [0.0, 0.0, 0.5, 0.0, 0.5, 0.125, 0.5, 0.0, 0.0, 0.0]
    assert credits[5].tags == ("edited_source",)


def test_successful_attempts_get_full_weight_and_crashed_ones_none() -> None:
    assert weights(assign_credit(agent_trajectory(FAILED_ATTEMPT, status="SUCCEEDED"), CreditConfig())) == [1.0] * 10
    crashed = assign_credit(agent_trajectory(FAILED_ATTEMPT, status="CRASHED"), CreditConfig())
    assert weights(crashed) == [0.0] * 10 and all("not_credited" in credit.tags for credit in crashed)
    strict = CreditConfig(zero_unproductive_in_successes=True)
    succeeded = assign_credit(agent_trajectory(FAILED_ATTEMPT, status="SUCCEEDED"), strict)
    assert weights(succeeded) == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_weights_and_progress_floor_come_from_the_config() -> None:
    config = CreditConfig(
        weights=CreditWeights(ran_tests=0.2, verified=0.4, reproduced=0.6), progress_floor=0.0,
        progress_signals=["tests_passed_fraction", "lint_ok"],
    )  # fmt: skip
    trajectory = agent_trajectory(FAILED_ATTEMPT, signals={"tests_passed_fraction": 0.2, "lint_ok": 1.0})
    # progress = mean(0.2, 1.0) = 0.6, floor 0 -> factor 0.6
    assert weights(assign_credit(trajectory, config))[2:7] == [0.36, 0.0, 0.6, 0.15, 0.24]


def test_step_scores_credit_what_the_rules_missed_but_never_lift_a_vetoed_step() -> None:
    config = CreditConfig(score_credit={"prm": 0.5})
    trajectory = agent_trajectory(FAILED_ATTEMPT, signals={"tests_passed_fraction": 1.0})  # factor 1
    scores = {"prm": {0: 0.8, 3: 1.0, 6: 2.0, 9: float("nan")}}
    credits = assign_credit(trajectory, config, step_scores=scores, fix_files={"calc.py"})
    # step 0: 0.5 * 0.8; step 3 (repeated) stays 0; step 6: max(1.0, 0.5 * clip(2.0)) = 1.0; NaN abstains
    assert weights(credits) == [0.4, 0.25, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_rerunning_a_command_after_an_edit_is_not_a_repeat() -> None:
    turns: list[Turn] = [
        (shell("pytest -q"), result(1, "FAILED test_x"), "tool_calls"),
        (shell("pytest -q"), result(1, "FAILED test_x"), "tool_calls"),
        (shell("echo fixed >> src/x.py"), result(0), "tool_calls"),
        (shell("pytest -q"), result(0, "1 passed"), "tool_calls"),
        (shell("pytest -q"), result(0, "1 passed"), "tool_calls"),
    ]
    tags = [credit.tags for credit in assign_credit(agent_trajectory(turns), CreditConfig())]
    assert tags == [("ran_tests", "reproduced"), ("repeated",), ("edited_source",), ("ran_tests", "verified"),
                    ("repeated",)]  # fmt: skip


def test_fix_files_are_the_non_test_files_a_successful_attempt_edited() -> None:
    facts = step_facts(agent_trajectory(FAILED_ATTEMPT, status="SUCCEEDED"))
    assert fix_files_of([facts]) == frozenset({"src/calc.py"})


def test_actions_are_read_from_codex_argv_commands_patches_and_text_harness_replies() -> None:
    argv = {"type": "function", "function": {"name": "shell", "arguments": json.dumps(
        {"command": ["bash", "-lc", "python -m pytest tests/test_a.py"]})}}  # fmt: skip
    patch = "*** Begin Patch\n*** Update File: src/a.py\n@@\n-x\n+y\n*** End Patch"
    apply = {"type": "function", "function": {"name": "apply_patch", "arguments": json.dumps({"input": patch})}}
    editor = {"type": "function", "function": {"name": "str_replace_editor", "arguments": json.dumps(
        {"command": "create", "path": "tests/test_b.py", "file_text": "def test(): pass"})}}  # fmt: skip
    trajectory = agent_trajectory([(argv, result(1, "FAILED"), "tool_calls"), (apply, None, "tool_calls"),
                                   (editor, None, "tool_calls")])  # fmt: skip
    actions = trajectory_actions(trajectory.steps)
    assert (actions[0][0].runs_tests, actions[0][0].exit_code) == (True, 1)
    assert actions[1][0].edited == ("src/a.py",)
    assert actions[2][0].edited == ("tests/test_b.py",)
    text_step = Step(
        call_index=0, conversation_id=0, policy_version=1, prompt_token_ids=np.arange(2, dtype=np.int32),
        completion_token_ids=np.arange(2, dtype=np.int32), completion_logprobs=np.zeros(2, dtype=np.float32),
        request_messages=[{"role": "user", "content": "task"}], response_text="Run it:\n```bash\npython x.py\n```",
        response_tool_calls=[], finish_reason="stop",
    )  # fmt: skip
    observation = {"role": "user", "content": "<returncode>1</returncode>\n<output>Traceback</output>"}
    follow = Step(
        **{
            **{s: getattr(text_step, s) for s in Step.__slots__},
            "call_index": 1,  # type: ignore[attr-defined]
            "request_messages": [*text_step.request_messages, {"role": "assistant"}, observation],
        }
    )
    [[text_action], _] = trajectory_actions([text_step, follow])
    assert (text_action.command, text_action.runs_code, text_action.exit_code) == ("python x.py", True, 1)


@pytest.mark.parametrize(
    ("command", "edited"),
    [
        ("python - <<'PY'\nif a > b: open('src/m.py', 'w').write(s)\nPY", ["src/m.py"]),
        ("echo 'a > b' > notes.txt 2>&1", ["notes.txt"]),
        ("grep -rn foo . > /dev/null", []),
        ("cp src/a.py src/b.py && tee -a log.txt < x", ["log.txt", "src/b.py"]),
        ("./run.sh && perl -pi -e 's/x/y/' lib/z.pl", ["lib/z.pl"]),
    ],
)
def test_shell_edits_are_found_and_quoted_or_heredoc_text_is_not(command: str, edited: list[str]) -> None:
    assert edited_paths(command) == edited


def test_a_command_that_was_not_found_is_invalid() -> None:
    assert command_action("shell", "pyhton x.py", result(127, "sh: pyhton: not found")).invalid
