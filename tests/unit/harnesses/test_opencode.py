"""The opencode adapter without opencode: its config, the command a shell runs (a stand-in ``opencode`` prints what
it got), and how its events are read."""

from __future__ import annotations

import doctest
import json
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from orchard.harnesses import opencode
from orchard.harnesses.base import HarnessTask, ModelEndpoint
from orchard.harnesses.opencode import OpencodeAdapter, last_text, parse_events, run_status

TOKEN = "episode-token-0123456789"  # noqa: S105 - a test token
ENDPOINT = ModelEndpoint(base_url="http://127.0.0.1:9100/v1", api_key=SecretStr(TOKEN), model="orchard-policy")
STAND_IN = """#!/bin/sh
exec python3 -c 'import json, os, sys
keys = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "OPENCODE_CONFIG", "ORCHARD_API_KEY", "OPENCODE_DISABLE_AUTOUPDATE")
print(json.dumps({"type": "text", "part": {"text": json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read(),
                  "env": {k: os.environ.get(k) for k in keys}})}}))
print(json.dumps({"type": "step_finish", "part": {"reason": "stop"}}))' "$@"
"""


def test_the_config_declares_the_proxy_as_a_provider_and_the_step_limit() -> None:
    adapter = OpencodeAdapter(executable="opencode", context_tokens=32768, extra_config={"agent": {"build": {"x": 1}}})
    assert adapter.config(ENDPOINT, HarnessTask(instruction="x", max_steps=9)) == {
        "$schema": "https://opencode.ai/config.json",
        "model": "orchard/orchard-policy",
        "small_model": "orchard/orchard-policy",
        "autoupdate": False,
        "share": "disabled",
        "permission": "allow",
        "agent": {"build": {"steps": 9, "x": 1}},
        "provider": {
            "orchard": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Orchard proxy",
                "options": {"baseURL": "http://127.0.0.1:9100/v1", "apiKey": "{env:ORCHARD_API_KEY}"},
                "models": {"orchard-policy": {"name": "orchard-policy", "limit": {"context": 32768, "output": 4096}}},
            }
        },
    }
    assert adapter.environment(ENDPOINT, HarnessTask(instruction="x")) == {"ORCHARD_API_KEY": TOKEN}


def test_the_command_passes_the_task_verbatim_on_stdin(tmp_path: Path) -> None:
    stand_in = tmp_path / "opencode"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    state = tmp_path / "home" / ".orchard" / "harness" / "opencode"
    state.mkdir(parents=True)
    task = HarnessTask(instruction='Fix "the bug" in `x.py`\n\n  then stop\n')
    (state / "task.md").write_text(task.instruction)  # what prepare writes
    adapter = OpencodeAdapter(executable=str(stand_in))
    command = adapter.command(ENDPOINT, task)

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), **adapter.environment(ENDPOINT, task)}
    subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, check=True)  # noqa: S603

    events = parse_events((state / "events.jsonl").read_text())
    assert (run_status(events), TOKEN in " ".join(command)) == ("stop", False)
    assert json.loads(last_text(events) or "") == {
        "argv": ["run", "--pure", "--format", "json", "--title", "Orchard episode", "-m", "orchard/orchard-policy"],
        "stdin": task.instruction,
        "env": {
            "XDG_CONFIG_HOME": str(state / "config"),
            "XDG_DATA_HOME": str(state / "data"),
            "OPENCODE_CONFIG": str(state / "opencode.json"),
            "ORCHARD_API_KEY": TOKEN,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        },
    }


@pytest.mark.parametrize(
    ("events", "status", "text"),
    [
        ('{"type":"text","part":{"text":"hi"}}\n{"type":"step_finish","part":{"reason":"stop"}}', "stop", "hi"),
        ('{"type":"step_finish","part":{"reason":"tool-calls"}}\n{"type":"error","error":{"name":"APIError"}}',
         "APIError", None),
        ('{"type":"step_start"}\nnot json', None, None),
    ],
)  # fmt: skip
def test_how_the_run_ended_comes_from_the_events(events: str, status: str | None, text: str | None) -> None:
    parsed = parse_events(events)
    assert (run_status(parsed), last_text(parsed)) == (status, text)


def test_doctests() -> None:
    results = doctest.testmod(opencode)
    assert (results.failed, results.attempted > 0) == (0, True)
