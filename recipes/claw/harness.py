"""The ``claw`` harness adapter: runs the Claw agent (``recipes.claw.agent``) in the sandbox against the proxy.

It is the built-in agent's adapter (same options, command line, task file, trajectory and collection) with another
program: the agent's runtime modules (the agent, the services, the tools, the MCP server; standard library, httpx and
``orchard.harnesses.builtin_agent`` only) are written into the sandbox under
``~/.orchard/harness/claw/src/recipes/claw/`` and put first on ``PYTHONPATH`` (the adapter's ``package``), so the
agent runs with the sandbox's shared interpreter whether or not this checkout's ``recipes`` package is visible inside
the sandbox.

Register it before running Claw episodes (``register()``, or ``orchard.harnesses.base.register_adapter("claw",
ClawAgentAdapter)``), then submit episodes with ``"harness": "claw"``.
"""

from __future__ import annotations

from pathlib import Path

from orchard.harnesses.base import register_adapter
from orchard.harnesses.builtin import AgentPackage, BuiltinAgentAdapter

SOURCE_DIR = Path(__file__).resolve().parent
RUNTIME_MODULES = ("__init__.py", "agent.py", "services.py", "tools.py", "mcp_server.py")
"""What the agent needs inside the sandbox (never the generator, grader or expert)."""


class ClawAgentAdapter(BuiltinAgentAdapter):
    """Runs ``python -m recipes.claw.agent`` in the working copy (which holds the task's ``.claw/seed.json``)."""

    name = "claw"
    package = AgentPackage(
        "recipes.claw.agent", SOURCE_DIR, RUNTIME_MODULES, '"""Orchard recipes (Claw agent only)."""\n'
    )


def register() -> None:
    """Make ``get_adapter("claw", **options)`` build a ``ClawAgentAdapter``."""
    register_adapter(ClawAgentAdapter.name, ClawAgentAdapter)
