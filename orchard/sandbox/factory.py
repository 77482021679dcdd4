"""The sandbox runtime seam: a config union keyed by ``type`` and ``open_runtime`` beside the interface.

The interface is ``orchard.sandbox.Runtime``; the backends are ``local`` (``orchard.sandbox.local.runtime``: process
trees in namespaces on this machine) and ``kubernetes`` (``orchard.sandbox.kubernetes.runtime``: one Pod per episode).
``orchard env serve --runtime local|kubernetes [--runtime-config FILE]`` builds the config and opens the runtime
through ``open_runtime``; so does anything else that runs sandboxes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from orchard.config import describe_validation_error
from orchard.exceptions import ConfigError
from orchard.sandbox import Runtime
from orchard.sandbox.kubernetes.objects import KubernetesRuntimeConfig


class LocalRuntimeConfig(BaseModel):
    """The ``local`` runtime: sandboxes under a directory of this machine (its settings come from the caller: where
    sandboxes live, what they may not see, what they share read-only)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = "local"


RuntimeConfig = Annotated[LocalRuntimeConfig | KubernetesRuntimeConfig, Field(discriminator="type")]
RUNTIME_TYPES = ("local", "kubernetes")


def read_runtime_config(path: Path, default_type: str) -> RuntimeConfig:
    """The runtime settings in the YAML file ``path`` (``type`` defaults to ``default_type``); a bad file or field
    raises ``ConfigError`` naming it."""
    try:
        data: Any = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"--runtime-config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"--runtime-config {path}: not YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--runtime-config {path}: must be a mapping of runtime settings")
    try:
        return TypeAdapter(RuntimeConfig).validate_python({"type": default_type, **data})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, f"--runtime-config {path}")) from exc


def open_runtime(
    config: RuntimeConfig,
    *,
    sandboxes: Path,
    hidden_paths: Sequence[Path] = (),
    shared_paths: Sequence[Path] = (),
) -> Runtime:
    """The runtime ``config`` names. ``sandboxes``, ``hidden_paths`` and ``shared_paths`` are the local runtime's
    (pods never see this machine's files)."""
    if isinstance(config, LocalRuntimeConfig):
        from orchard.sandbox.local.runtime import LocalRuntime

        return LocalRuntime(sandboxes, hidden_paths=list(hidden_paths), shared_paths=list(shared_paths))
    from orchard.sandbox.kubernetes.runtime import KubernetesRuntime

    return KubernetesRuntime(config)
