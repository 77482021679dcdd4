"""``open_engine``: the one place that turns an engine config into a backend (each imported only when used)."""

from __future__ import annotations

from orchard.engines.base import Engine
from orchard.engines.config import AnyEngineConfig, EngineConfig, ScriptedEngineConfig


def open_engine(config: AnyEngineConfig) -> Engine:
    """Build the engine ``config.type`` names: ``local`` loads the checkpoint (building a tiny-family one first),
    ``vllm`` launches vLLM or attaches to ``vllm.url``, ``scripted`` reads its plan. Close it when done."""
    match config:
        case EngineConfig(type="local"):
            from orchard.engines.local import LocalEngine

            return LocalEngine.from_config(config)
        case EngineConfig(type="vllm"):
            from orchard.engines.vllm_backend import open_vllm

            return open_vllm(config)
        case ScriptedEngineConfig():
            from orchard.engines.scripted_engine import ScriptedEngine

            return ScriptedEngine.from_config(config)
        case _:
            raise TypeError(f"unknown engine config {type(config).__name__} (type {getattr(config, 'type', None)!r})")
