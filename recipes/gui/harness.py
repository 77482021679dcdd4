"""Adapter of the browser harness (``recipes.gui.agent``): the built-in agent's adapter with a browser command.

Register it as harness ``browser`` (``orchard.harnesses.base._FACTORIES["browser"] =
"recipes.gui.harness:BrowserAgentAdapter"``, or ``register_adapter("browser", BrowserAgentAdapter)``); options, as
an episode request's ``options.harness``: ``mode`` (``text``: the accessibility-tree view only, the CPU mode;
``vision``: screenshots too), ``chromium`` (the executable), and the built-in adapter's ``python``, ``retries``,
``temperature``, ``max_tokens``, ``extra_body``. Files in the sandbox (``~/.orchard/harness/browser/``): ``task.md``
and ``trajectory.jsonl``; the agent runs in the working copy, where the task's ``.gui/seed.json`` is.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.harnesses.base import HarnessTask, ModelEndpoint, ShellArg, shell_command, write_state_file
from orchard.harnesses.builtin import TASK_FILE, TRAJECTORY_FILE, BuiltinAgentAdapter
from orchard.sandbox import Sandbox
from recipes.gui.agent import CHROMIUM

SOURCE_DIR = Path(__file__).resolve().parent
RUNTIME_MODULES = (
    "__init__.py", "agent.py", "page_view.py",
    "apps/__init__.py", "apps/core.py", "apps/server.py", "apps/shop.py", "apps/booking.py", "apps/docs.py",
)  # fmt: skip
"""What the agent and the apps need inside the sandbox (never the generator, the grader or the references)."""
SRC = "src"


class BrowserAgentAdapter(BuiltinAgentAdapter):
    """Runs ``python -m recipes.gui.agent`` against the endpoint."""

    name = "browser"

    def __init__(
        self,
        mode: str = "text",
        chromium: str = CHROMIUM,
        python: str = sys.executable,
        retries: int = 3,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        """``mode``: ``text`` or ``vision``; ``chromium``: the browser executable in the sandbox."""
        if mode not in ("text", "vision"):
            raise ValueError(f"mode must be 'text' or 'vision', got {mode!r}")
        super().__init__(
            python=python, retries=retries, temperature=temperature, max_tokens=max_tokens, extra_body=extra_body
        )
        self.mode, self.chromium = mode, chromium

    files_in_command = False  # its own command: prepare writes the task text and the agent's source

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the task text and the agent's and apps' modules (the checkout may not be visible in the sandbox:
        a private ``/tmp`` hides a checkout there, and a shared machine may hide it on purpose)."""
        super().prepare(sandbox, endpoint, task)
        write_state_file(sandbox, self.state(f"{SRC}/recipes/__init__.py"), '"""Orchard recipes (GUI agent only)."""\n')
        for module in RUNTIME_MODULES:
            write_state_file(sandbox, self.state(f"{SRC}/recipes/gui/{module}"), (SOURCE_DIR / module).read_bytes())

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``python -m recipes.gui.agent`` with the endpoint, mode, limits and state file paths."""
        argv: list[ShellArg] = [
            self.python, "-P", "-m", "recipes.gui.agent",  # -P: the working copy never shadows the agent
            "--base-url", endpoint.base_url,
            "--model", endpoint.model,
            "--task-file", self.state(TASK_FILE),
            "--trajectory", self.state(TRAJECTORY_FILE),
            "--mode", self.mode,
            "--chromium", self.chromium,
            "--max-steps", str(task.max_steps),
            "--timeout", f"{task.timeout_s:g}",
            "--retries", str(self.retries),
        ]  # fmt: skip
        if self.temperature is not None:
            argv += ["--temperature", f"{self.temperature:g}"]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        if self.extra_body:
            argv += ["--extra-body", json.dumps(self.extra_body)]
        return shell_command(argv, exports={"PYTHONPATH": self.state(SRC)})
