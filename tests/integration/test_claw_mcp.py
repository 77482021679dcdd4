"""The Claw MCP server as a client sees it: a child process speaking JSON-RPC 2.0 over stdio that initializes, lists
every service tool and calls them against a task's services, whose state lands in the working copy."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from recipes.claw.services import STATE_FILE
from recipes.claw.tasks import ClawConfig, generate, load_solutions
from recipes.claw.tools import TOOL_SPECS

TASK_ID = "claw-eval-tasks-from-mail-000"


class StdioClient:
    """A minimal MCP client over a child's stdin and stdout."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process, self.next_id = process, 0

    def send(self, message: dict[str, Any]) -> None:
        """Write one message line."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send a request and read its response (the server answers in order)."""
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}})
        assert self.process.stdout is not None
        response: dict[str, Any] = json.loads(self.process.stdout.readline())
        assert (response["jsonrpc"], response["id"]) == ("2.0", self.next_id)
        return response


def test_the_mcp_server_lists_and_calls_the_service_tools_over_stdio(tmp_path: Path) -> None:
    generate(ClawConfig(train_per_kind=0, eval_per_kind=1), tmp_path / "tasks")
    workdir = tmp_path / "work"
    shutil.copytree(tmp_path / "tasks" / "eval" / TASK_ID / "workspace", workdir)
    process = subprocess.Popen(  # noqa: S603 - our own module
        [sys.executable, "-m", "recipes.claw.mcp_server", "--workdir", str(workdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = StdioClient(process)
    try:
        init = client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {}})
        assert init["result"]["protocolVersion"] == "2025-06-18"
        assert init["result"]["capabilities"]["tools"] == {"listChanged": False}
        client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})  # a notification: no answer

        tools = client.request("tools/list")["result"]["tools"]
        assert [tool["name"] for tool in tools] == [spec.name for spec in TOOL_SPECS]
        assert all(tool["inputSchema"]["type"] == "object" for tool in tools)

        for item in load_solutions(tmp_path / "tasks", "eval", TASK_ID)["reference"]:
            result = client.request("tools/call", {"name": item["name"], "arguments": item["arguments"]})["result"]
            assert result["isError"] is False, result
            assert json.loads(result["content"][0]["text"]) == result["structuredContent"]

        refused = client.request("tools/call", {"name": "tasks_update", "arguments": {"task_id": "t-99"}})["result"]
        assert refused["isError"] is True and "no task with id" in refused["content"][0]["text"]
        assert client.request("tools/call", {"name": "rm_rf", "arguments": {}})["error"]["code"] == -32602
        assert client.request("resources/list")["error"]["code"] == -32601
        assert client.request("ping")["result"] == {}
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=10)
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()
        process.stderr.close()
    assert process.returncode == 0
    state = json.loads((workdir / STATE_FILE).read_text())
    check = json.loads((tmp_path / "tasks" / "eval" / TASK_ID / "hidden" / "check.json").read_text())
    assert sorted((t["title"], t["due"]) for t in state["tasks"][-len(check["tasks"]) :]) == sorted(
        (t["title"], t["due"]) for t in check["tasks"]
    )
