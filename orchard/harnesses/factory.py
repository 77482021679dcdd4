"""The harness adapter seam: a config keyed by ``type`` and ``open_harness`` beside the interface.

The interface is ``orchard.harnesses.base.HarnessAdapter``. Adapters are registered by name
(``orchard.harnesses.base.register_adapter``; the built-in ones, ``builtin``, ``codex``, ``claude-code``, ...,
are imported on first use), so a recipe adds its own (``browser``, ``claw``, ``openclaw``) without the core importing
it. The config is therefore one model whose ``type`` is a registered name and whose ``options`` are that adapter's
constructor arguments, not a closed union of one model per adapter. An episode request names the same two things
(``harness`` and ``options.harness``); the episode runner opens its adapter through ``open_harness``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchard.harnesses.base import HarnessAdapter, get_adapter


class HarnessConfig(BaseModel):
    """Which harness adapter (``type``: its registered name) and the options it is built with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, description="A registered adapter name: builtin, codex, claw, ...")
    options: dict[str, Any] = Field(default_factory=dict, description="The adapter's constructor arguments.")


def open_harness(config: HarnessConfig) -> HarnessAdapter:
    """A new adapter of the harness ``config`` names (``UnknownHarnessError`` for a name nobody registered)."""
    return get_adapter(config.type, **config.options)
