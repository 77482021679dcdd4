"""The run directory: the resolved config, the recipe copy, per-component logs, ``state.json``, bus and store.

Layout::

    RUN_DIR/recipe.yaml     the validated recipe (paths made absolute); --resume reads it
    RUN_DIR/orchard.yaml    the resolved bus/store config every component reads (ORCHARD_CONFIG); no secrets
    RUN_DIR/state.json      components, PIDs, restarts, exit codes, stages; rewritten on every change
    RUN_DIR/logs/NAME.log   stdout and stderr of each component, appended across restarts and resumes
    RUN_DIR/bus, RUN_DIR/store   the embedded bus and local store, unless the recipe or environment says otherwise
    RUN_DIR/secrets.env     tokens generated for the run (mode 0600), when the environment gives none
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchard.config import DEFAULT_HOME, OrchardConfig, S3StoreConfig, describe_validation_error
from orchard.exceptions import ConfigError
from orchard.run.config import RunConfig
from orchard.run.settings import FullConfig

GENERATED_SECRETS = ("ORCHARD_PROXY_ADMIN_TOKEN", "ORCHARD_ENV_TOKEN")


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory."""

    root: Path

    @property
    def recipe(self) -> Path:
        """The recipe copy."""
        return self.root / "recipe.yaml"

    @property
    def orchard_config(self) -> Path:
        """The resolved Orchard config the components read."""
        return self.root / "orchard.yaml"

    @property
    def state(self) -> Path:
        """``state.json``."""
        return self.root / "state.json"

    @property
    def secrets(self) -> Path:
        """Generated tokens."""
        return self.root / "secrets.env"

    def log(self, component: str) -> Path:
        """The log file of ``component``."""
        return self.root / "logs" / f"{component}.log"

    def read_state(self) -> dict[str, Any]:
        """The last written state ({} if none)."""
        try:
            state: dict[str, Any] = json.loads(self.state.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {self.state}: {exc}") from exc
        return state

    def write_state(self, state: dict[str, Any]) -> None:
        """Replace ``state.json`` atomically (a reader never sees half a file)."""
        tmp = self.state.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, self.state)


def default_run_dir(recipe: Path) -> Path:
    """``.orchard/runs/<recipe stem>-<UTC time>``."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", recipe.stem).strip("-") or "run"
    return DEFAULT_HOME / "runs" / f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"


def run_id_for(recipe: RunConfig, run_dir: Path) -> str:
    """The recipe's ``run_id``, else the run directory's name."""
    return recipe.run_id or re.sub(r"[^A-Za-z0-9._-]+", "-", run_dir.resolve().name) or "run"


def resolve_orchard_config(recipe: RunConfig, run_dir: Path, settings: Path | None = None) -> FullConfig:
    """Bus, store and consumer settings of the run: the recipe's (default: inside ``run_dir``), replaced by a
    settings file's sections, overridden by ``ORCHARD_*`` variables. A ``ORCHARD_BUS__TYPE``/``ORCHARD_STORE__TYPE``
    naming another backend than the recipe's replaces that section, so Kafka + S3 need no recipe change."""
    data: dict[str, Any] = {
        "run_id": run_id_for(recipe, run_dir),
        "bus": recipe.bus.model_dump() if recipe.bus else {"type": "embedded", "path": run_dir.resolve() / "bus"},
        "store": recipe.store.model_dump() if recipe.store else {"type": "local", "path": run_dir.resolve() / "store"},
    }
    if recipe.consumers is not None:
        data["consumers"] = recipe.consumers.model_dump()
    if settings is not None:
        data |= _settings_sections(settings)
    for section in ("bus", "store"):
        env_type = os.environ.get(f"ORCHARD_{section.upper()}__TYPE")
        if env_type and env_type != data[section].get("type"):
            del data[section]  # the environment describes another backend entirely
    try:
        return FullConfig(**data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "run settings (recipe, --settings, ORCHARD_*)")) from exc


def _settings_sections(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read settings {path}: {exc}") from exc
    allowed = {"bus", "store", "consumers", "log_format", "log_level"}
    if not isinstance(loaded, dict) or not set(loaded) <= allowed:
        raise ConfigError(f"settings {path} must be a mapping of {sorted(allowed)}; got {sorted(loaded or {})}")
    return loaded


def public_dump(config: OrchardConfig) -> dict[str, Any]:
    """The config as JSON-able data without secrets (they reach components through the environment)."""
    data = config.model_dump(mode="json")
    if isinstance(config.store, S3StoreConfig):
        for key in ("access_key", "secret_key"):
            data["store"].pop(key, None)
    return data


def secret_environment(config: OrchardConfig, run_dir: RunDir) -> dict[str, str]:
    """Secrets the components need: the store's keys, and the proxy/Env tokens (generated once per run if unset)."""
    env: dict[str, str] = {}
    if isinstance(config.store, S3StoreConfig):
        for key, secret in (("ACCESS_KEY", config.store.access_key), ("SECRET_KEY", config.store.secret_key)):
            if secret.get_secret_value():
                env[f"ORCHARD_STORE__{key}"] = secret.get_secret_value()
    stored = _read_secrets(run_dir.secrets)
    missing = [name for name in GENERATED_SECRETS if not os.environ.get(name)]
    for name in missing:
        env[name] = stored.get(name) or secrets.token_urlsafe(24)
    if missing and any(name not in stored for name in missing):
        run_dir.secrets.touch(mode=0o600)
        run_dir.secrets.write_text("".join(f"{name}={env[name]}\n" for name in missing))
    return env


def _read_secrets(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, value in pairs}
