"""The pi adapter without pi: its models and settings, the command a shell runs (a stand-in ``pi`` prints what it
got), and how its last assistant message is read."""

from __future__ import annotations

import doctest
import json
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from orchard.harnesses import pi
from orchard.harnesses.base import HarnessTask, ModelEndpoint
from orchard.harnesses.pi import PiAdapter, last_assistant, message_text

TOKEN = "episode-token-0123456789"  # noqa: S105 - a test token
ENDPOINT = ModelEndpoint(base_url="http://127.0.0.1:9100/v1", api_key=SecretStr(TOKEN), model="orchard-policy")
STAND_IN = """#!/bin/sh
exec python3 -c 'import json, os, sys
keys = ("PI_CODING_AGENT_DIR", "ORCHARD_API_KEY", "PI_OFFLINE", "PI_TELEMETRY", "PI_SKIP_VERSION_CHECK")
text = json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read(), "env": {k: os.environ.get(k) for k in keys}})
message = {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}
print(json.dumps({"type": "agent_end", "messages": [message]}))' "$@"
"""


def test_the_models_declare_the_proxy_as_a_provider() -> None:
    adapter = PiAdapter(executable="pi", api="openai-responses", output_tokens=2048)
    assert adapter.models(ENDPOINT) == {
        "providers": {
            "orchard": {
                "baseUrl": "http://127.0.0.1:9100/v1",
                "api": "openai-responses",
                "apiKey": "ORCHARD_API_KEY",
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [{"id": "orchard-policy", "contextWindow": 131072, "maxTokens": 2048}],
            }
        }
    }
    assert adapter.settings(ENDPOINT) == {
        "defaultProvider": "orchard",
        "defaultModel": "orchard-policy",
        "enableInstallTelemetry": False,
        "quietStartup": True,
    }
    assert adapter.environment(ENDPOINT, HarnessTask(instruction="x")) == {"ORCHARD_API_KEY": TOKEN}


def test_the_command_passes_the_task_on_stdin(tmp_path: Path) -> None:
    stand_in = tmp_path / "pi"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    state = tmp_path / "home" / ".orchard" / "harness" / "pi"
    state.mkdir(parents=True)
    task = HarnessTask(instruction="@not-a-file: fix `x.py`\n\nthen stop\n")
    (state / "task.md").write_text(task.instruction)  # what prepare writes
    adapter = PiAdapter(executable=str(stand_in))
    command = adapter.command(ENDPOINT, task)

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), **adapter.environment(ENDPOINT, task)}
    subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, check=True)  # noqa: S603

    last = last_assistant((state / "events.jsonl").read_text())
    assert last is not None and (last["stopReason"], TOKEN in " ".join(command)) == ("stop", False)
    assert json.loads(message_text(last) or "") == {
        "argv": [
            "-p", "--mode", "json", "--provider", "orchard", "--model", "orchard-policy",
            "--session-dir", str(state / "sessions"),
        ],
        "stdin": task.instruction,
        "env": {
            "PI_CODING_AGENT_DIR": str(state / "agent"),
            "ORCHARD_API_KEY": TOKEN,
            "PI_OFFLINE": "1",
            "PI_TELEMETRY": "0",
            "PI_SKIP_VERSION_CHECK": "1",
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("events", "status", "text"),
    [
        ('{"type":"message_end","message":{"role":"assistant","stopReason":"toolUse","content":[]}}\n'
         '{"type":"agent_end","messages":[{"role":"user"},{"role":"assistant","stopReason":"stop",'
         '"content":[{"type":"text","text":"done"}]}]}', "stop", "done"),
        ('{"type":"message_end","message":{"role":"assistant","stopReason":"error","content":[],'
         '"errorMessage":"401 Incorrect API key"}}', "error", "401 Incorrect API key"),
        ('{"type":"message_end","message":{"role":"user"}}\nnot json', None, None),
    ],
)  # fmt: skip
def test_how_the_run_ended_comes_from_the_last_assistant_message(
    events: str, status: str | None, text: str | None
) -> None:
    last = last_assistant(events)
    assert (last.get("stopReason") if last else None, message_text(last)) == (status, text)


def test_doctests() -> None:
    results = doctest.testmod(pi)
    assert (results.failed, results.attempted > 0) == (0, True)
