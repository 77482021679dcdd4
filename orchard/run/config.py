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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from consumers.config import ConsumersConfig
from orchard.config import BusConfig, StoreConfig, describe_validation_error
from orchard.exceptions import ConfigError
from orchard.run.recipe_layers import layered_recipe, replace_in_strings

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_NAME = re.compile(NAME_PATTERN)
URL_PLACEHOLDER = re.compile(r"\{url:([^{}]*)\}")
"""``{url:NAME}`` in a command component's words: the base URL of server component NAME (``http://host:port``)."""


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
    cpu_threads: int | None = Field(
        None, ge=1, description="Local engine on a CPU: torch threads (default: one per core); `--cpu-threads`."
    )


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
    stop_grace_s: float = Field(
        60.0,
        ge=0,
        le=600,
        description="Wait after SIGTERM before SIGKILL. Env cancels its running episodes and publishes their "
        "outcomes on the way down; killed before that, those outcomes are lost and a resumed rollout submits the "
        "same episodes again.",
    )

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


class RolloutComponent(_Component):
    """``orchard rollout run``: BAR rounds over a task directory, or (``demos``) the expert's demonstration episodes.

    It exits 0 once every episode it submitted has an outcome, so a stage can wait for it (``until: {exits: [..]}``).
    """

    kind: Literal["rollout"]
    service: str = Field(..., min_length=1, description="Orchard Env base URL, or the name of an env component.")
    tasks: Path = Field(..., description="Directory of task directories (the Env's catalog, or a subset of it).")
    demos: Path | None = Field(None, description="Directory with demonstrations.jsonl: submit exactly those episodes.")
    harness: str = Field("builtin", min_length=1, description="Harness of every episode.")
    model: str = Field("policy", min_length=1, description="Model name the harness asks the proxy for.")
    rounds: int | None = Field(None, ge=1, description="BAR rounds (default 1).")
    episodes: int | None = Field(None, ge=1, description="Cap on the episodes submitted in all.")
    budget: int = Field(64, ge=1, description="BAR: rollouts per round over all tasks.")
    min_rollouts: int = Field(2, ge=0, description="BAR: rollouts every task gets each round.")
    max_rollouts: int = Field(32, ge=1, description="BAR: cap on one task's group per round.")
    max_task_outcomes: int | None = Field(
        None, ge=1, description="BAR: a task with this many outcomes in the run gets no more rollouts (None: no limit)."
    )
    prior_successes: float = Field(1.0, gt=0, description="BAR: pseudo-successes of every task's prior.")
    prior_failures: float = Field(1.0, gt=0, description="BAR: pseudo-failures of every task's prior.")
    aim: Literal["mixed", "failing"] = Field("mixed", description="BAR: which mixed groups come first.")
    episode_timeout_s: float | None = Field(None, ge=1, description="Override of Env's per-episode limit.")
    wait_timeout_s: float = Field(3600.0, ge=1, description="Longest wait for a round's outcomes (then exit 1).")
    new_policy_wait_s: float | None = Field(
        None,
        gt=0,
        description="Before each round after the first, wait up to this long for a newer policy version of the run.",
    )
    seed: int | None = Field(None, ge=0, description="Give each episode's harness a sampling seed derived from this.")
    lockstep: bool = Field(
        False,
        description="Train each round, whole, before the next (producers.rollout.scheduler); its trainer takes "
        "input: rounds.",
    )
    lockstep_after: list[str] = Field(
        default_factory=lambda: ["assembler", "sample-builder"],
        min_length=1,
        description="With lockstep: consumer groups, in pipeline order, done with their topics before a round counts "
        "as made.",
    )
    engine: str | None = Field(
        None,
        description="With lockstep: the policy engine (base URL or component name) that must serve each round's "
        "trained version before the next round.",
    )

    @model_validator(mode="after")
    def _lockstep_alone(self) -> Self:
        if self.lockstep and self.new_policy_wait_s is not None:
            raise ValueError("lockstep waits for the version trained on each round: drop new_policy_wait_s")
        if self.engine is not None and not self.lockstep:
            raise ValueError("engine is what lockstep waits for: set lockstep: true too")
        if self.lockstep and self.engine is None:
            raise ValueError(
                "lockstep: name the engine that serves the policy (engine: NAME or URL), so each round "
                "starts on the version trained on the round before"
            )
        if self.demos is not None and (self.lockstep or self.seed is not None):
            raise ValueError("lockstep and seed apply to rollout rounds, not to demos")
        return self

    def references(self) -> list[str]:
        """The Env and the engine, when they name components."""
        return [name for name in (self.service, self.engine) if name is not None and "://" not in name]


class CommandComponent(_Component):
    """Any command: a one-shot step (generate data, ``orchard eval``) or a server of the recipe's own (``port``).

    In ``run``, a first word ``orchard`` or ``python`` means this environment's ``orchard`` and interpreter, and
    ``{run_dir}`` / ``{recipe_dir}`` in any word become the run directory and the recipe's directory. ``{url:NAME}``
    in ``run`` or ``args`` becomes the base URL of server component NAME, which is then a dependency (like ``after``).
    """

    kind: Literal["command"]
    run: list[str] = Field(..., min_length=1, description="The command line, one word per item (no shell).")
    host: str = Field("127.0.0.1", min_length=1, description="Where the server listens (with port).")
    port: int | None = Field(None, ge=1, le=65535, description="A server's port: probed by health, checked unique.")

    def url_placeholders(self) -> dict[str, list[str]]:
        """Component names of the ``{url:NAME}`` placeholders, per field (``run``, ``args``), in order."""
        found = {field: [m for word in words for m in URL_PLACEHOLDER.findall(word)]
                 for field, words in (("run", self.run), ("args", self.args))}  # fmt: skip
        return {field: names for field, names in found.items() if names}

    def references(self) -> list[str]:
        """The components named by ``{url:NAME}`` placeholders."""
        return list(dict.fromkeys(name for names in self.url_placeholders().values() for name in names))

    def default_health(self) -> HealthCheck:
        """``/healthz`` for a server, else "still alive after 1 s"."""
        return HttpHealth() if self.port is not None else AliveHealth()

    def listen_port(self) -> int | None:
        """The ``port`` field."""
        return self.port


ComponentSpec = Annotated[
    EngineComponent
    | ScriptedEngineComponent
    | ProxyComponent
    | EnvComponent
    | ConsumerComponent
    | PolicyTrainerComponent
    | ValueTrainerComponent
    | RolloutComponent
    | CommandComponent,
    Field(discriminator="kind"),
]

ONE_SHOT_KINDS = ("rollout", "command")


class StageUntil(_Strict):
    """When a stage is done: every condition given holds (at least one must be given)."""

    exits: list[str] = Field(default_factory=list, description="These components have exited 0.")
    policy_version: int | None = Field(
        None, ge=0, description="A PolicyVersion at least this number is on policy-versions (this run)."
    )
    topic: str | None = Field(None, min_length=1, description="This topic holds at least `count` records.")
    count: int = Field(1, ge=1, description="Records `topic` must hold.")
    scored_by: list[str] = Field(
        default_factory=list,
        description="Scorer names: every trajectory (with calls) of this run published since the stage began has a "
        "StepScore of each of them on scores (a stage that must not end before its dense rewards are in).",
    )
    caught_up: list[str] = Field(
        default_factory=list,
        description="Consumer groups that have processed every record of the topics they read (committed past the "
        "last record of each partition): e.g. a sample builder done with the trajectories, so that the samples the "
        "next stage trains on (input: complete) are all on the bus.",
    )

    @model_validator(mode="after")
    def _some_condition(self) -> StageUntil:
        if not (self.exits or self.policy_version is not None or self.topic or self.scored_by or self.caught_up):
            raise ValueError("give at least one of exits, policy_version, topic, scored_by, caught_up")
        return self

    @property
    def reads_bus(self) -> bool:
        """Whether a condition is read from the bus (not only from component exits)."""
        return self.policy_version is not None or self.topic is not None or bool(self.scored_by or self.caught_up)


class StageConfig(_Strict):
    """One stage of a staged pipeline (SFT, RL, eval, ...): components to start, and when it is done.

    At the stage's start its ``components`` are started (those that exited or were stopped start afresh; those
    running stay up); when ``until`` holds, its ``stop`` components are stopped and the next stage begins.
    Components no stage lists run for the whole run.
    """

    name: str = Field(..., pattern=NAME_PATTERN, description="Unique stage name.")
    description: str = Field("", description="What the stage does.")
    components: list[str] = Field(default_factory=list, description="Components started when the stage begins.")
    until: StageUntil | None = Field(
        None,
        description="Completion condition (default: its rollout and command components exited 0; with none, the "
        "stage runs until the run is stopped).",
    )
    stop: list[str] = Field(default_factory=list, description="Components stopped when the stage is done.")
    timeout_s: float | None = Field(None, gt=0, description="The run fails if the stage is not done in this time.")
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
    stages: list[StageConfig] = Field(default_factory=list, description="Stages, run in order (StageConfig).")
    recipe: str | None = Field(None, description="Recipe name (recorded).")
    model: str | None = Field(None, description="Starting model of the recipe (recorded; components name their own).")
    model_seed: int | None = Field(None, description="Its initialisation seed (recorded).")
    harness: str | None = Field(None, description="Harness of the recipe's episodes (recorded).")
    tasks: dict[str, Any] = Field(default_factory=dict, description="Task generation settings (recorded).")
    grader: dict[str, Any] = Field(default_factory=dict, description="Grader settings (recorded).")
    expert: dict[str, Any] = Field(default_factory=dict, description="Expert demonstration settings (recorded).")
    eval: dict[str, Any] = Field(default_factory=dict, description="Held-out evaluation settings (recorded).")

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
            if isinstance(spec, CommandComponent):
                self._check_url_placeholders(name, spec)
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
            until = stage.until.exits if stage.until else []
            for field, refs in (("components", stage.components), ("stop", stage.stop), ("until.exits", until)):
                for ref in refs:
                    if ref not in self.components:
                        raise ValueError(f"stages.{index}.{field}: {ref!r} is not a component of this recipe")
        ports: dict[int, str] = {}
        for name, spec in self.components.items():
            port = spec.listen_port()
            if port is not None and port in ports:
                raise ValueError(f"components.{name}.port: {port} is also used by {ports[port]!r}")
            if port is not None:
                ports[port] = name
        self.start_order()  # raises on a cycle
        return self

    def _check_url_placeholders(self, name: str, spec: CommandComponent) -> None:
        for field, refs in spec.url_placeholders().items():
            for ref in refs:
                target = self.components.get(ref)
                if target is None or ref == name:
                    problem = "names no other component of this recipe"
                    raise ValueError(f"components.{name}.{field}: {{url:{ref}}} {problem}")
                if target.listen_port() is None:
                    raise ValueError(
                        f"components.{name}.{field}: {{url:{ref}}} names component {ref!r}, which is not a server "
                        f"(a {target.kind} component without a port has no URL)"
                    )

    def stage_exits(self, stage: StageConfig) -> list[str]:
        """The components whose exit ends ``stage``: ``until.exits``, else its rollout and command components."""
        if stage.until is not None:
            return stage.until.exits
        return [name for name in stage.components if self.components[name].kind in ONE_SHOT_KINDS]

    def staged(self) -> set[str]:
        """Components some stage lists (they start with their stage; the others start with the run)."""
        return {name for stage in self.stages for name in stage.components}

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


_PATH_FIELDS = {
    "scripted-engine": ("plan",),
    "env": ("tasks",),
    "policy-trainer": ("config",),
    "rollout": ("tasks", "demos"),
}
RUN_DIR = "{run_dir}"
RECIPE_DIR = "{recipe_dir}"
RECORDED_BLOCKS = ("tasks", "grader", "expert", "eval")
"""The recipe's recorded settings: ``{recipe_dir}`` in them is replaced too, for the setup stage that reads them."""


def parse_run_config(data: Any, source: str, base_dir: Path | None = None) -> RunConfig:
    """Validate a recipe mapping; relative paths are made absolute against ``base_dir``, and ``{recipe_dir}`` in a
    command's words, a component's arguments and the recorded blocks (``tasks:``, ...) becomes its absolute path.

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
    recipe_dir = str(base_dir.resolve())
    for block in RECORDED_BLOCKS:
        setattr(config, block, replace_in_strings(getattr(config, block), RECIPE_DIR, recipe_dir))
    for spec in config.components.values():
        for field in _PATH_FIELDS.get(spec.kind, ()):
            value = getattr(spec, field)
            if value is None or str(value).startswith(RUN_DIR):  # placed in the run directory at start
                continue
            value = Path(str(value).replace(RECIPE_DIR, recipe_dir))
            if not value.is_absolute():
                value = (base_dir / value).resolve()
            setattr(spec, field, value)
        if isinstance(spec, CommandComponent):
            spec.run = [word.replace(RECIPE_DIR, recipe_dir) for word in spec.run]
        spec.args = [word.replace(RECIPE_DIR, recipe_dir) for word in spec.args]
    return config


def load_run_config(path: Path, overlays: Sequence[Path] = (), sets: Sequence[str] = ()) -> RunConfig:
    """Read and validate the recipe at ``path``, with ``overlays`` merged over it and ``sets`` (``PATH=VALUE``)
    applied (``orchard.run.recipe_layers``); relative paths are relative to ``path``."""
    source = " + ".join([str(path), *map(str, overlays), *(f"--set {s}" for s in sets)])
    return parse_run_config(layered_recipe(path, overlays, sets), source, Path(path).resolve().parent)
