"""The config every ``orchard`` command loads: the core's sections (``OrchardConfig``) and the layers' sections.

The core's ``orchard.config`` imports nothing above it, so it keeps a layer's section as plain data; here, among the
entry points, each such section gets its layer's model. A bad consumer setting therefore still fails at start with
its field named, and ``ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS='["SFT"]'`` is parsed as the list it names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from consumers.config import ConsumersConfig
from orchard.config import OrchardConfig, load_config


class FullConfig(OrchardConfig):
    """``OrchardConfig`` with the consumers' settings validated by their own model (``consumers:``)."""

    consumers: ConsumersConfig = Field(  # type: ignore[assignment]
        default_factory=ConsumersConfig, description="Settings of the stream consumers."
    )


def load_full_config(path: Path | None = None, **overrides: Any) -> FullConfig:
    """``orchard.config.load_config`` validating with ``FullConfig``."""
    return load_config(path, schema=FullConfig, **overrides)
