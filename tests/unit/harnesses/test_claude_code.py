"""The Claude Code adapter without Claude Code: its variables, the command a shell runs (a stand-in ``claude`` prints
what it got), and how the result event is read."""

from __future__ import annotations

import doctest
import json
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from orchard.harnesses import claude_code
from orchard.harnesses.base import HarnessTask, ModelEndpoint
from orchard.harnesses.claude_code import ClaudeCodeAdapter, exit_status, result_event

TOKEN = "episode-token-0123456789"  # noqa: S105 - a test token
ENDPOINT = ModelEndpoint(base_url="http://127.0.0.1:9100/v1", api_key=SecretStr(TOKEN), model="orchard-policy")
STAND_IN = """#!/bin/sh
# a stand-in claude: prints its arguments and the variables it was given as a stream-json result event
python3 -c "$(cat <<'EOF'
import json, os, sys
keys = ("CLAUDE_CONFIG_DIR", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_MODEL_CAPABILITIES")
print(json.dumps({"type": "system", "subtype": "init"}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read(),
                                        "env": {k: os.environ.get(k) for k in keys}})}))
EOF
)" "$@"
"""


def test_the_variables_point_claude_code_at_the_proxy_root_and_keep_it_quiet() -> None:
    adapter = ClaudeCodeAdapter(executable="claude", max_output_tokens=4096, extra_env={"MAX_THINKING_TOKENS": "0"})
    assert adapter.settings_env(ENDPOINT) == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9100",
        "ANTHROPIC_MODEL": "orchard-policy",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "orchard-policy",
        "ANTHROPIC_SMALL_FAST_MODEL": "orchard-policy",
        "CLAUDE_CODE_SUBAGENT_MODEL": "orchard-policy",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY": "1",
        "DISABLE_COST_WARNINGS": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "IS_SANDBOX": "1",
        "CLAUDE_CODE_MODEL_CAPABILITIES": "-mid_conv_system,-mid_conv_tool_change",
        "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "MAX_THINKING_TOKENS": "0",
    }
    assert adapter.environment(ENDPOINT, HarnessTask(instruction="x")) == {"ANTHROPIC_AUTH_TOKEN": TOKEN}
    own_guess = ClaudeCodeAdapter(executable="claude", capabilities="", experimental_betas=True)
    assert {"CLAUDE_CODE_MODEL_CAPABILITIES", "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS"} & set(
        own_guess.settings_env(ENDPOINT)
    ) == set()


def test_the_command_passes_the_task_verbatim_on_stdin_and_writes_events_into_the_state_directory(
    tmp_path: Path,
) -> None:
    stand_in = tmp_path / "claude"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    home = tmp_path / "home"
    state = home / ".orchard" / "harness" / "claude-code"
    state.mkdir(parents=True)
    task = HarnessTask(
        instruction='--help is not an option: fix `x` in "$HOME"\'s file\n\n  then stop\n\n', max_steps=7
    )
    (state / "task.md").write_text(task.instruction)  # what prepare writes
    adapter = ClaudeCodeAdapter(executable=str(stand_in))
    command = adapter.command(ENDPOINT, task)

    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), **adapter.environment(ENDPOINT, task)}
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, check=True, text=True)  # noqa: S603

    assert (done.stdout, TOKEN in " ".join(command)) == ("", False)
    result = result_event((state / "events.jsonl").read_text())
    assert result is not None and exit_status(result) == "success"
    assert json.loads(result["result"]) == {
        "argv": [
            "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
            "--model", "orchard-policy", "--max-turns", "7",
        ],
        "stdin": task.instruction,
        "env": {
            "CLAUDE_CONFIG_DIR": str(state / "config"),
            "ANTHROPIC_BASE_URL": "http://127.0.0.1:9100",
            "ANTHROPIC_AUTH_TOKEN": TOKEN,
            "CLAUDE_CODE_MODEL_CAPABILITIES": "-mid_conv_system,-mid_conv_tool_change",
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("events", "status"),
    [
        ('{"type":"result","subtype":"success","is_error":false,"result":"done"}', "success"),
        ('{"type":"result","subtype":"success","is_error":true,"result":"API Error: 401"}', "error"),
        ('{"type":"result","subtype":"error_max_turns","is_error":true}', "error_max_turns"),
        ('{"type":"result","subtype":"error_during_execution","is_error":true}', "error_during_execution"),
        ('{"type":"system","subtype":"init"}\n{"type":"assistant"}', None),
        ("", None),
    ],
)
def test_how_the_run_ended_comes_from_the_result_event(events: str, status: str | None) -> None:
    assert exit_status(result_event(events)) == status


def test_a_bad_output_token_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="max_output_tokens"):
        ClaudeCodeAdapter(executable="claude", max_output_tokens=0)


def test_doctests() -> None:
    results = doctest.testmod(claude_code)
    assert (results.failed, results.attempted > 0) == (0, True)
