"""The ``claw`` harness adapter: runs the Claw agent (``recipes.claw.agent``) in the sandbox against the proxy.

It is the built-in agent's adapter (same options, task file, trajectory and collection) with another program: the
agent's runtime modules (the agent, the services, the tools, the MCP server; standard library, httpx and
``orchard.harnesses.builtin_agent`` only) are written into the sandbox under
``~/.orchard/harness/claw/src/recipes/claw/`` and put first on ``PYTHONPATH``, so the agent runs with the sandbox's
shared interpreter whether or not this checkout's ``recipes`` package is visible inside the sandbox.

Register it before running Claw episodes (``register()``, or ``orchard.harnesses.base.register_adapter("claw",
ClawAgentAdapter)``), then submit episodes with ``"harness": "claw"``.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchard.harnesses.base import (
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    register_adapter,
    shell_command,
    write_state_file,
)
from orchard.harnesses.builtin import TASK_FILE, TRAJECTORY_FILE, BuiltinAgentAdapter
from orchard.sandbox import Sandbox

SOURCE_DIR = Path(__file__).resolve().parent
RUNTIME_MODULES = ("__init__.py", "agent.py", "services.py", "tools.py", "mcp_server.py")
"""What the agent needs inside the sandbox (never the generator, grader or expert)."""
SRC = "src"


class ClawAgentAdapter(BuiltinAgentAdapter):
    """Runs ``python -m recipes.claw.agent`` in the working copy (which holds the task's ``.claw/seed.json``)."""

    name = "claw"

    files_in_command = False  # its own command: prepare writes the task text and the agent's source

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the task text and the agent's modules."""
        super().prepare(sandbox, endpoint, task)
        write_state_file(
            sandbox, self.state(f"{SRC}/recipes/__init__.py"), '"""Orchard recipes (Claw agent only)."""\n'
        )
        for module in RUNTIME_MODULES:
            source = (SOURCE_DIR / module).read_bytes()
            write_state_file(sandbox, self.state(f"{SRC}/recipes/claw/{module}"), source)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``python -m recipes.claw.agent`` with the endpoint, limits and state file paths."""
        argv: list[ShellArg] = [
            self.python, "-P", "-m", "recipes.claw.agent",  # -P: the working copy never shadows the agent
            "--base-url", endpoint.base_url,
            "--model", endpoint.model,
            "--task-file", self.state(TASK_FILE),
            "--trajectory", self.state(TRAJECTORY_FILE),
            "--max-steps", str(task.max_steps),
            "--timeout", f"{task.timeout_s:g}",
            "--command-timeout", f"{self.command_timeout_s:g}",
            "--max-output-chars", str(self.max_output_chars),
            "--retries", str(self.retries),
        ]  # fmt: skip
        if self.temperature is not None:
            argv += ["--temperature", f"{self.temperature:g}"]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        if self.extra_body:
            argv += ["--extra-body", json.dumps(self.extra_body)]
        return shell_command(argv, exports={"PYTHONPATH": self.state(SRC)})


def register() -> None:
    """Make ``get_adapter("claw", **options)`` build a ``ClawAgentAdapter``."""
    register_adapter(ClawAgentAdapter.name, ClawAgentAdapter)
