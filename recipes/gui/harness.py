"""Adapter of the browser harness (``recipes.gui.agent``): the built-in agent's adapter with a browser command.

Register it as harness ``browser`` (``orchard.harnesses.base._FACTORIES["browser"] =
"recipes.gui.harness:BrowserAgentAdapter"``, or ``register_adapter("browser", BrowserAgentAdapter)``); options, as
an episode request's ``options.harness``: ``mode`` (``text``: the accessibility-tree view only, the CPU mode;
``vision``: screenshots too), ``chromium`` (the executable), and the built-in adapter's ``python``, ``retries``,
``temperature``, ``max_tokens``, ``extra_body``. Files in the sandbox (``~/.orchard/harness/browser/``): ``task.md``
and ``trajectory.jsonl``; the agent runs in the working copy, where the task's ``.gui/seed.json`` is.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.harnesses.builtin import AgentPackage, BuiltinAgentAdapter
from recipes.gui.agent import CHROMIUM

SOURCE_DIR = Path(__file__).resolve().parent
RUNTIME_MODULES = (
    "__init__.py", "agent.py", "page_view.py",
    "apps/__init__.py", "apps/core.py", "apps/server.py", "apps/shop.py", "apps/booking.py", "apps/docs.py",
)  # fmt: skip
"""What the agent and the apps need inside the sandbox (never the generator, the grader or the references). They are
written into it because the checkout may not be visible there: a private ``/tmp`` hides a checkout there, and a
shared machine may hide it on purpose."""


class BrowserAgentAdapter(BuiltinAgentAdapter):
    """Runs ``python -m recipes.gui.agent`` against the endpoint."""

    name = "browser"
    package = AgentPackage(
        "recipes.gui.agent", SOURCE_DIR, RUNTIME_MODULES, '"""Orchard recipes (GUI agent only)."""\n'
    )

    def __init__(
        self,
        mode: str = "text",
        chromium: str = CHROMIUM,
        python: str = sys.executable,
        retries: int = 3,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        """``mode``: ``text`` or ``vision``; ``chromium``: the browser executable in the sandbox."""
        if mode not in ("text", "vision"):
            raise ValueError(f"mode must be 'text' or 'vision', got {mode!r}")
        super().__init__(
            python=python, retries=retries, temperature=temperature, max_tokens=max_tokens, extra_body=extra_body,
            seed=seed,
        )  # fmt: skip
        self.mode, self.chromium = mode, chromium

    def agent_options(self) -> list[str]:
        """The browser agent's own options: its mode and the browser executable."""
        return ["--mode", self.mode, "--chromium", self.chromium]
