"""The recipe of ``orchard run``: which components to start, how to check and restart them, and on which bus/store.

A recipe is YAML validated at start (``extra="forbid"``: a misspelt key fails with its field named). Components are
a mapping ``name -> spec``; the spec's ``kind`` picks what runs, always the same ``orchard ...`` command a user would
type to start that component alone, so a recipe is a list of commands plus supervision policy::

    run_id: demo
    components:
      engine: {kind: scripted-engine, plan: plan.yaml, port: 8000}
      proxy: {kind: proxy, backend: engine, port: 8100}      # a component name becomes its URL (and a dependency)
      assembler: {kind: consumer, name: assembler, after: [proxy]}
    restart: {max_restarts: 5, backoff_s: 1}

``bus`` and ``store`` default to an embedded log and a local directory inside the run directory, so every run is
isolated and resumable; ``ORCHARD_BUS__*`` / ``ORCHARD_STORE__*`` (or ``--settings FILE``) swap them for Kafka and S3
without touching the recipe. Relative paths in a recipe are relative to the recipe file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from consumers.config import ConsumersConfig
from orchard.config import BusConfig, StoreConfig, describe_validation_error
from orchard.exceptions import ConfigError

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HttpHealth(_Strict):
    """Healthy once ``GET http://host:port<path>`` answers 200."""

    type: Literal["http"] = "http"
    path: str = Field("/healthz", pattern=r"^/", description="Path probed on the component's host and port.")


class AliveHealth(_Strict):
    """Healthy once the process has stayed up for ``alive_s`` seconds (consumers, trainers)."""

    type: Literal["alive"] = "alive"
    alive_s: float = Field(1.0, ge=0, le=600, description="Seconds the process must survive to count as started.")


HealthCheck = Annotated[HttpHealth | AliveHealth, Field(discriminator="type")]


class RestartPolicy(_Strict):
    """When a component that exited is started again, and how often at most."""

    policy: Literal["on-failure", "always", "never"] = Field(
        "on-failure", description="on-failure: restart unless it exited 0; always: restart any exit; never."
    )
    max_restarts: int = Field(5, ge=0, le=10_000, description="Restarts allowed before the component counts failed.")
    backoff_s: float = Field(1.0, ge=0, le=3600, description="Wait before the first restart; doubled each time.")
    backoff_max_s: float = Field(30.0, ge=0, le=3600, description="Longest wait between restarts.")

    def delay(self, restarts: int) -> float:
        """Seconds to wait before restart number ``restarts + 1``."""
        return min(self.backoff_s * 2**restarts, self.backoff_max_s)


class _Component(_Strict):
    after: list[str] = Field(default_factory=list, description="Components that must be healthy before this starts.")
    health: HealthCheck | None = Field(None, description="Readiness check (default: by kind).")
    restart: RestartPolicy | None = Field(None, description="Restart policy (default: the recipe's).")
    start_timeout_s: float = Field(120.0, gt=0, le=3600, description="Longest wait for the component to be healthy.")
    stop_grace_s: float = Field(10.0, ge=0, le=600, description="Wait after SIGTERM before SIGKILL.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra (non-secret) environment variables.")
    args: list[str] = Field(default_factory=list, description="Extra command-line arguments, appended verbatim.")

    def references(self) -> list[str]:
        """Component names this spec points at besides ``after`` (URLs given as a component name)."""
        return []

    def default_health(self) -> HealthCheck:
        """The readiness check used when ``health`` is not set."""
        return AliveHealth()

    def listen_port(self) -> int | None:
        """The TCP port the component serves on, if it is a server."""
        return None


class _Server(_Component):
    host: str = Field("127.0.0.1", min_length=1, description="Interface to listen on.")

    def default_health(self) -> HealthCheck:
        """Servers are ready when ``/healthz`` answers."""
        return HttpHealth()

    def listen_port(self) -> int | None:
        """The ``port`` field."""
        port: int = getattr(self, "port")  # noqa: B009 - every server subclass declares its own default port
        return port


class EngineComponent(_Server):
    """``orchard engine serve``: Orchard's local engine (or the vLLM shim)."""

    kind: Literal["engine"]
    model: str = Field("tiny-llama", min_length=1, description="Checkpoint directory or built-in tiny-* name.")
    port: int = Field(8000, ge=1, le=65535)
    reload: bool = Field(False, description="Follow policy-versions and hot-reload weights.")
    backend: Literal["local", "vllm"] = "local"
    max_batch_size: int = Field(32, ge=1)


class ScriptedEngineComponent(_Server):
    """``orchard engine scripted PLAN``: the scripted OpenAI backend (tests, demos, expert demonstrations)."""

    kind: Literal["scripted-engine"]
    plan: Path = Field(..., description="YAML/JSON plan of replies and tool calls.")
    port: int = Field(8000, ge=1, le=65535)
    policy_version: int = Field(0, ge=0)

    def default_health(self) -> HealthCheck:
        """The scripted backend has no ``/healthz``; ``/v1/models`` answers once it serves."""
        return HttpHealth(path="/v1/models")


class ProxyComponent(_Server):
    """``orchard proxy serve``: the recording proxy (admin token from ``ORCHARD_PROXY_ADMIN_TOKEN``)."""

    kind: Literal["proxy"]
    backend: str = Field(..., min_length=1, description="Engine base URL, or the name of an engine component.")
    port: int = Field(8100, ge=1, le=65535)

    def references(self) -> list[str]:
        """The engine, when ``backend`` names a component."""
        return [] if "://" in self.backend else [self.backend]


class EnvComponent(_Server):
    """``orchard env serve``: the episode service on the local runtime (``ORCHARD_ENV_TOKEN``)."""

    kind: Literal["env"]
    tasks: Path = Field(..., description="Directory of task directories.")
    proxy: str = Field(..., min_length=1, description="Proxy base URL, or the name of a proxy component.")
    port: int = Field(8200, ge=1, le=65535)
    concurrency: int = Field(8, ge=1)
    timeout_s: float = Field(1800.0, ge=1, description="Wall-clock limit per episode.")

    def references(self) -> list[str]:
        """The proxy, when ``proxy`` names a component."""
        return [] if "://" in self.proxy else [self.proxy]


class ConsumerComponent(_Component):
    """``orchard consumer run NAME``: a built-in consumer, a registered reward, or ``module:attr``."""

    kind: Literal["consumer"]
    name: str = Field(..., min_length=1, description="assembler, sample-builder, a reward name, or module:attr.")
    group: str | None = Field(None, description="Consumer group (default: the consumer's own).")
    instance: str | None = Field(None, description="Instance id (default: the component name, so restarts rejoin).")
    namespace: str | None = Field(None, description="Read and write <namespace>.<topic>.")


class PolicyTrainerComponent(_Component):
    """``orchard train policy``: SFT/RL on the samples topic."""

    kind: Literal["policy-trainer"]
    config: Path | None = Field(None, description="YAML PolicyTrainerConfig (defaults if omitted).")
    set: list[str] = Field(default_factory=list, description="Overrides 'key.path=value', as with --set.")


class ValueTrainerComponent(_Component):
    """``orchard train value``: the value model on finished trajectories (other options through ``args``)."""

    kind: Literal["value-trainer"]
    model: str = Field("tiny-llama", min_length=1, description="Backbone: a tiny-family name or a checkpoint.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many steps.")


ComponentSpec = Annotated[
    EngineComponent
    | ScriptedEngineComponent
    | ProxyComponent
    | EnvComponent
    | ConsumerComponent
    | PolicyTrainerComponent
    | ValueTrainerComponent,
    Field(discriminator="kind"),
]


class StageConfig(_Strict):
    """One stage of a staged pipeline (SFT, RL, ...): validated and recorded; not yet executed by ``orchard run``."""

    name: str = Field(..., pattern=NAME_PATTERN, description="Unique stage name.")
    description: str = Field("", description="What the stage does.")
    components: list[str] = Field(default_factory=list, description="Components the stage runs.")
    options: dict[str, Any] = Field(default_factory=dict, description="Stage-specific settings, recorded as given.")


class RunConfig(_Strict):
    """A recipe: the components of a run, their supervision, and the bus and store they share."""

    run_id: str | None = Field(
        None, min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Run identity (default: the run dir's name)."
    )
    bus: BusConfig | None = Field(None, description="Bus (default: an embedded log in RUN_DIR/bus).")
    store: StoreConfig | None = Field(None, description="Store (default: a local directory RUN_DIR/store).")
    consumers: ConsumersConfig | None = Field(None, description="Consumer settings shared by every consumer.")
    components: dict[str, ComponentSpec] = Field(..., min_length=1, description="Components by name.")
    restart: RestartPolicy = Field(default_factory=RestartPolicy, description="Default restart policy.")
    create_topics: bool = Field(
        True, description="Create Orchard's standard topics before starting (existing ones are kept)."
    )
    stop_when_done: list[str] = Field(
        default_factory=list, description="The run stops cleanly once all of these components have exited 0."
    )
    stages: list[StageConfig] = Field(default_factory=list, description="Staged pipeline (recorded only, for now).")

    @field_validator("components")
    @classmethod
    def _names(cls, components: dict[str, ComponentSpec]) -> dict[str, ComponentSpec]:
        for name in components:
            if not _NAME.match(name):
                raise ValueError(f"component name {name!r} must match {NAME_PATTERN} (it names a log file)")
        return components

    @model_validator(mode="after")
    def _references(self) -> RunConfig:
        for name, spec in self.components.items():
            for ref in [*spec.after, *spec.references()]:
                if ref not in self.components or ref == name:
                    raise ValueError(f"components.{name}: {ref!r} is not another component of this recipe")
        for ref in self.stop_when_done:
            if ref not in self.components:
                raise ValueError(f"stop_when_done: {ref!r} is not a component of this recipe")
        seen: set[str] = set()
        for index, stage in enumerate(self.stages):
            if stage.name in seen:
                raise ValueError(f"stages.{index}.name: stage {stage.name!r} appears twice")
            seen.add(stage.name)
            for ref in stage.components:
                if ref not in self.components:
                    raise ValueError(f"stages.{index}.components: {ref!r} is not a component of this recipe")
        ports: dict[int, str] = {}
        for name, spec in self.components.items():
            port = spec.listen_port()
            if port is not None and port in ports:
                raise ValueError(f"components.{name}.port: {port} is also used by {ports[port]!r}")
            if port is not None:
                ports[port] = name
        self.start_order()  # raises on a cycle
        return self

    def dependencies(self, name: str) -> list[str]:
        """Components ``name`` waits for: its ``after`` list and the components its URLs name."""
        spec = self.components[name]
        return list(dict.fromkeys([*spec.after, *spec.references()]))

    def start_order(self) -> list[str]:
        """Component names, each after its dependencies (recipe order otherwise); ``ValueError`` on a cycle."""
        order: list[str] = []
        visiting: list[str] = []

        def visit(name: str) -> None:
            if name in order:
                return
            if name in visiting:
                cycle = " -> ".join([*visiting[visiting.index(name) :], name])
                raise ValueError(f"components: dependency cycle {cycle}")
            visiting.append(name)
            for dep in self.dependencies(name):
                visit(dep)
            visiting.pop()
            order.append(name)

        for name in self.components:
            visit(name)
        return order

    def restart_policy(self, name: str) -> RestartPolicy:
        """The component's own restart policy, else the recipe's."""
        return self.components[name].restart or self.restart

    def health_check(self, name: str) -> HealthCheck:
        """The component's readiness check."""
        spec = self.components[name]
        return spec.health or spec.default_health()

    def items(self) -> Iterator[tuple[str, ComponentSpec]]:
        """Components in start order."""
        for name in self.start_order():
            yield name, self.components[name]


_PATH_FIELDS = {"scripted-engine": ("plan",), "env": ("tasks",), "policy-trainer": ("config",)}


def parse_run_config(data: Any, source: str, base_dir: Path | None = None) -> RunConfig:
    """Validate a recipe mapping; relative paths are made absolute against ``base_dir``.

    Raises ``ConfigError`` with one line per bad field (``components.engine.port: ...``).
    """
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {source} must be a mapping at the top level")
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from exc
    if base_dir is None:
        return config
    for spec in config.components.values():
        for field in _PATH_FIELDS.get(spec.kind, ()):
            value = getattr(spec, field)
            if value is not None and not Path(value).is_absolute():
                setattr(spec, field, (base_dir / value).resolve())
    return config


def load_run_config(path: Path) -> RunConfig:
    """Read and validate the recipe at ``path``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read recipe {path}: {exc}") from exc
    return parse_run_config(data, str(path), Path(path).resolve().parent)
