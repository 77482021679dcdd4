"""The Claw harness adapters' commands: the Claw agent runs from the modules shipped into the sandbox, with the proxy
token only in the environment; the OpenClaw adapter names a missing installation and keeps the token out of argv."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from orchard.harnesses.base import HarnessNotInstalledError, HarnessTask, ModelEndpoint, get_adapter
from recipes.claw.harness import ClawAgentAdapter, register
from recipes.claw.openclaw import OpenClawAdapter, installation, openclaw_tool_call

ENDPOINT = ModelEndpoint(base_url="http://127.0.0.1:9000/v1", api_key=SecretStr("tok-secret"), model="policy")
TASK = HarnessTask(instruction="Triage my inbox.", max_steps=12, timeout_s=90)


def test_the_claw_agent_runs_from_the_shipped_modules_with_the_token_in_its_environment() -> None:
    register()
    adapter = get_adapter("claw", python="/venv/bin/python", temperature=0.5)
    assert isinstance(adapter, ClawAgentAdapter)
    shell, flag, script = adapter.command(ENDPOINT, TASK)
    assert (shell, flag) == ("/bin/sh", "-c")
    # the agent runs, then the same command prints its trajectory and patch (no collect exec), and exits as it did
    assert script.startswith('export PYTHONPATH="${HOME:?}"/.orchard/harness/claw/src; /venv/bin/python -P -m ')
    assert "orchard-collect claw/trajectory.jsonl ." in script and script.endswith("; exit $s")
    assert "recipes.claw.agent" in script and "--max-steps 12" in script and "--temperature 0.5" in script
    assert "tok-secret" not in script
    assert adapter.environment(ENDPOINT, TASK)["OPENAI_API_KEY"] == "tok-secret"


def test_the_openclaw_adapter_names_a_missing_installation(tmp_path: Path) -> None:
    with pytest.raises(HarnessNotInstalledError, match="openclaw.mjs not found"):
        OpenClawAdapter(prefix=str(tmp_path), node="/bin/sh")


def test_the_openclaw_command_reads_its_config_and_keeps_the_token_out_of_argv(tmp_path: Path) -> None:
    node, entry = installation(tmp_path)
    for path in (node, entry):
        path.parent.mkdir(parents=True)
        path.write_text("")
    adapter = OpenClawAdapter(prefix=str(tmp_path))
    [_, _, script] = adapter.command(ENDPOINT, TASK)
    assert script.startswith(f"exec {node} {entry} agent exec --config ")
    assert "--model orchard/policy" in script and "--json" in script and "--timeout 90" in script
    assert script.endswith('> "${HOME:?}"/.orchard/harness/openclaw/result.json')
    assert "tok-secret" not in script and adapter.environment(ENDPOINT, TASK)["OPENAI_API_KEY"] == "tok-secret"
    assert openclaw_tool_call("mail_list", {"folder": "inbox"}) == {
        "name": "tool_call",
        "arguments": {"id": "claw__mail_list", "args": {"folder": "inbox"}},
    }
