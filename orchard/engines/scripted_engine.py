"""The ``scripted`` backend of the engine interface (``orchard.engines.base.Engine``): a ``ScriptedPlan`` replayed
by ``create_scripted_app`` at one policy version, with no weights to load or follow."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from fastapi import FastAPI
from pydantic import ValidationError

from orchard.engines.base import Engine
from orchard.engines.exceptions import EngineError
from orchard.engines.scripted import ScriptedPlan, TraceTokenizer, create_scripted_app
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.engines.config import ScriptedEngineConfig
    from orchard.engines.reload import PolicyReloader

log = get_logger("engines.scripted")


class ScriptedEngine(Engine):
    """The ``scripted`` backend of the engine interface: a plan replayed at one policy version (no weights)."""

    def __init__(self, plan: ScriptedPlan, policy_version: int = 0, tokenizer: TraceTokenizer | None = None) -> None:
        self.plan = plan
        self.tokenizer = tokenizer
        self._policy_version = policy_version

    @classmethod
    def from_config(cls, config: ScriptedEngineConfig) -> ScriptedEngine:
        """The engine replaying the plan in ``config.plan``; ``ValueError`` if it cannot be read."""
        try:
            plan = ScriptedPlan.from_file(config.plan)
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise ValueError(f"cannot load scripted plan {config.plan}: {exc}") from exc
        log.info("scripted plan loaded", plan=str(config.plan), steps=len(plan.steps))
        return cls(plan, config.policy_version)

    @property
    def model_name(self) -> str:
        """The plan's model id."""
        return self.plan.model

    @property
    def policy_version(self) -> int:
        """The version every answer's trace reports."""
        return self._policy_version

    def load_version(self, directory: Path, version: int) -> None:
        """Refused: a plan has no weights to replace."""
        raise EngineError("the scripted backend replays a plan; it has no weights to load")

    def create_app(self, reloader: PolicyReloader | None = None) -> FastAPI:
        """``create_scripted_app`` on this plan; a reloader is refused (nothing to reload)."""
        if reloader is not None:
            raise EngineError("the scripted backend replays a plan; it cannot follow policy versions")
        return create_scripted_app(self.plan, self._policy_version, self.tokenizer)

    def close(self) -> None:
        """Nothing to release."""
