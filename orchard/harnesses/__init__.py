"""Harness adapters: run a real agent harness (Codex CLI, mini-swe-agent, the built-in agent) against Orchard's proxy.

The public names are loaded lazily, so ``python -m orchard.harnesses.builtin_agent`` (which runs inside sandboxes with
only the standard library) never imports pydantic or the adapters. See ``README.md`` in this directory.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "HarnessAdapter",
    "HarnessArtifacts",
    "HarnessConfig",
    "HarnessRun",
    "HarnessTask",
    "ModelEndpoint",
    "adapter_names",
    "get_adapter",
    "open_harness",
    "register_adapter",
    "run_harness",
]
_FACTORY_NAMES = ("HarnessConfig", "open_harness")


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = "orchard.harnesses.factory" if name in _FACTORY_NAMES else "orchard.harnesses.base"
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
