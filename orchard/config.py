"""Typed configuration: pydantic models loadable from YAML and ``ORCHARD_*`` environment variables.

Backends are chosen by a ``type``-tagged union, so a bad value fails at start with the field named. A backend's
settings without a ``type`` mean the default backend when they fit it (``ORCHARD_BUS__PATH=/data/bus`` alone is an
embedded bus); otherwise the error says ``type`` is missing and lists the allowed types, naming the one to set when
another backend has every setting given (``ORCHARD_BUS__BOOTSTRAP_SERVERS`` alone: set ``ORCHARD_BUS__TYPE=kafka``).
The same holds for keyword overrides; a layer (file, environment, overrides) that gives a section another ``type``
replaces the section of the layers below.
Secrets (S3 keys) are ``SecretStr`` and are meant to come from the environment, never from files in git.
Nested fields are set from the environment with ``__``: ``ORCHARD_BUS__TYPE=kafka``,
``ORCHARD_BUS__BOOTSTRAP_SERVERS=host:9092``, ``ORCHARD_STORE__SECRET_KEY=...``.

This module holds the core's sections only (run, bus, store, logging) and imports nothing of the layers above it.
A section a layer above owns (``consumers:``) is kept here as plain data, so any process can read a config file that
has it; its layer's model validates it, and ``orchard.run.settings.FullConfig`` (what every ``orchard`` command
loads) types it, so its environment variables (``ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS``) work as before.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from orchard.exceptions import ConfigError

DEFAULT_HOME = Path(".orchard")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _tag(variant: type[BaseModel]) -> str:
    return str(variant.model_fields["type"].default)


def _tags(variant: type[BaseModel]) -> list[str]:
    """Every ``type`` a variant takes (one model may cover several, as ``local`` and ``vllm`` engines)."""
    return [str(tag) for tag in get_args(variant.model_fields["type"].annotation)] or [_tag(variant)]


def default_type(*variants: type[BaseModel], environment: bool = True) -> BeforeValidator:
    """For a union of ``variants`` keyed by ``type``: settings without a ``type`` are the first variant's when they
    fit it; otherwise the error says ``type`` is missing, lists the allowed types, and names the type to set when
    one other variant has every setting given (and its ``ORCHARD_*`` variable, unless ``environment`` is False: a
    config that is not read from the environment, as the trainer's).

    >>> fill = default_type(EmbeddedBusConfig, KafkaBusConfig).func
    >>> fill({"path": "/data/bus"}, None)
    {'type': 'embedded', 'path': '/data/bus'}
    """
    default = variants[0]

    def fill(value: Any, info: ValidationInfo | None) -> Any:
        if not isinstance(value, dict) or "type" in value:
            return value
        if set(value) <= set(default.model_fields):
            return {"type": _tag(default), **value}
        field = info.field_name if info is not None and info.field_name else ""
        raise _missing_type(sorted(value), variants, field if environment else "")

    return BeforeValidator(fill)


def _missing_type(given: list[str], variants: tuple[type[BaseModel], ...], field: str) -> PydanticCustomError:
    """The error for settings without a ``type`` that do not fit the default variant (``variants[0]``): what does
    not fit, the type to set, and the allowed types."""
    tags = [_tag(v) for v in variants]
    foreign = [name for name in given if name not in variants[0].model_fields]
    owners = [_tag(v) for v in variants[1:] if set(given) <= set(v.model_fields)]
    unknown = [name for name in foreign if not any(name in v.model_fields for v in variants)]
    env = f"ORCHARD_{field.upper()}__TYPE" if field else ""
    if owners:
        verb = "is a setting" if len(foreign) == 1 else "are settings"
        what = (
            f"{', '.join(foreign)} {verb} of type {' or '.join(map(repr, owners))}, not of the default type {tags[0]!r}"
        )
        hint = f"set type: {owners[0]}" + (f" (environment: {env}={owners[0]})" if env else "")
    else:
        verb = "is a setting" if len(unknown) == 1 else "are settings"
        what = f"{', '.join(unknown)} {verb} of no type" if unknown else f"no type has all of {', '.join(given)}"
        hint = "set type" + (f" (environment: {env})" if env else "") + " and only that type's settings"
    others = [tag for v in variants for tag in _tags(v) if tag != tags[0]]
    allowed = ", ".join([f"{tags[0]!r} (the default)", *map(repr, others)])
    return PydanticCustomError(
        "missing_type",
        "'type' is missing: {what}; {hint}; allowed types: {allowed}",
        {"what": what, "hint": hint, "allowed": allowed},
    )


class EmbeddedBusConfig(_Strict):
    """The default bus: a durable single-machine log in a directory, shared by the processes on one machine."""

    type: Literal["embedded"] = "embedded"
    path: Path = Field(DEFAULT_HOME / "bus", description="Directory holding topics, consumer groups and journals.")
    fsync: Literal["always", "never"] = Field(
        "never",
        description="'always' fsyncs every append before acknowledging it (survives power loss); "
        "'never' leaves flushing to the OS (survives a killed process, not a lost machine).",
    )
    verify_crc: bool = Field(
        False, description="Check each record's CRC-32 when reading (catches disk damage; costs ~12 us per 34 KB)."
    )
    segment_bytes: int = Field(64 * 1024 * 1024, ge=4096, description="Roll to a new segment past this size.")
    default_partitions: int = Field(4, ge=1, le=1024, description="Partitions of topics created implicitly.")
    retention_ms: int | None = Field(None, ge=1, description="Delete whole segments older than this (None: keep).")
    session_timeout_ms: int = Field(10_000, ge=100, description="A group member silent this long loses its share.")
    max_record_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest record (key + value) accepted.")


class KafkaBusConfig(_Strict):
    """Apache Kafka through confluent-kafka: idempotent producer, acks=all, transactions."""

    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(..., min_length=1, description="Comma-separated host:port list.")
    connect_timeout_s: float = Field(15.0, gt=0, description="Fail at start if no broker answers within this.")
    max_record_bytes: int = Field(
        1_000_000, ge=1024, description="Largest record (key + value) sent; keep below the broker's message.max.bytes."
    )
    default_partitions: int = Field(4, ge=1, le=10_000, description="Partitions of topics Orchard creates.")
    replication_factor: int | None = Field(
        None, ge=1, description="Replication of topics Orchard creates (None: 3, or the broker count when fewer)."
    )
    min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description="min.insync.replicas of topics Orchard creates (None: 2 with replication 3 or more, else 1); "
        "a topic's own config wins.",
    )
    request_timeout_s: float = Field(
        10.0, gt=0, description="Longest wait of one metadata, offsets, admin or transaction request."
    )
    retry_timeout_s: float = Field(
        120.0,
        ge=0,
        description="How long a request that timed out or met a moving leader or coordinator is retried (a broker "
        "restarting, a leader election) before the error is raised, naming what and for how long (0: no retry).",
    )
    retry_backoff_s: float = Field(0.2, gt=0, description="First pause between retries; doubles on each retry.")
    retry_backoff_max_s: float = Field(5.0, gt=0, description="Longest pause between retries.")
    transaction_timeout_s: float = Field(
        30.0,
        ge=1,
        le=900,
        description="How long the broker keeps a transaction open without its producer before aborting it: a "
        "consumer killed mid-transaction holds back its partitions' next owner (and read_committed readers of its "
        "outputs) this long. A transaction that takes longer is aborted and its batch retried.",
    )
    client_options: dict[str, str] = Field(
        default_factory=dict, description="Extra librdkafka options, e.g. security settings."
    )

    @model_validator(mode="after")
    def _check_replication(self) -> KafkaBusConfig:
        replication, min_isr = self.replication_factor, self.min_insync_replicas
        if replication is not None and min_isr is not None and min_isr > replication:
            raise ValueError(
                f"min_insync_replicas ({min_isr}) exceeds replication_factor ({replication}): no write could succeed"
            )
        strategy = self.client_options.get("partition.assignment.strategy", "range")
        if strategy != "range":
            raise ValueError(
                f"client_options: partition.assignment.strategy must be range, not {strategy!r}: a consumer's "
                "co-keyed inputs (a trajectory and its scores) must reach the same instance"
            )
        return self


BusConfig = Annotated[
    EmbeddedBusConfig | KafkaBusConfig, Field(discriminator="type"), default_type(EmbeddedBusConfig, KafkaBusConfig)
]


class LocalStoreConfig(_Strict):
    """The default store: a local directory."""

    type: Literal["local"] = "local"
    path: Path = Field(DEFAULT_HOME / "store", description="Root directory of artifacts.")
    fsync: Literal["always", "never"] = Field(
        "always",
        description="'always' fsyncs every write and its directory before it returns (survives power loss); "
        "'never' leaves flushing to the OS, as the embedded bus does by default (writes stay atomic; they survive "
        "a killed process, not a lost machine).",
    )


class S3StoreConfig(_Strict):
    """Any S3-compatible server (MinIO, SeaweedFS, AWS) through the minio client and the plain S3 API."""

    type: Literal["s3"] = "s3"
    endpoint: str = Field(..., min_length=1, description="host:port of the S3 API, without scheme.")
    bucket: str = Field("orchard", min_length=3, max_length=63, description="Bucket holding all artifacts.")
    access_key: SecretStr = Field(SecretStr(""), description="Access key id (from the environment).")
    secret_key: SecretStr = Field(SecretStr(""), description="Secret key (from the environment).")
    secure: bool = Field(False, description="Use HTTPS.")
    region: str | None = Field(None, description="Region name, when the server needs one.")
    part_size: int = Field(16 * 1024 * 1024, ge=5 * 1024 * 1024, description="Multipart upload part size.")
    parallel_uploads: int = Field(
        3, ge=1, le=16, description="Parts uploaded at once; memory held is about (this + 3) * part_size."
    )
    timeout_s: float = Field(10.0, gt=0, description="Connect/read timeout of one HTTP request.")
    retries: int = Field(2, ge=0, le=10, description="Retries of a failed HTTP request before giving up.")


StoreConfig = Annotated[
    LocalStoreConfig | S3StoreConfig, Field(discriminator="type"), default_type(LocalStoreConfig, S3StoreConfig)
]


class OrchardConfig(BaseSettings):
    """Everything a process needs to reach the bus and the store; the root of every component's config (the layers
    above the core extend it: ``orchard.run.settings.FullConfig``)."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_", env_nested_delimiter="__", extra="forbid")

    run_id: str = Field("default", min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="Identity of the run.")
    bus: BusConfig = Field(default_factory=EmbeddedBusConfig)
    store: StoreConfig = Field(default_factory=LocalStoreConfig)
    consumers: dict[str, Any] = Field(
        default_factory=dict,
        description="Settings of the stream consumers, as plain data; validated by the consumers' own model "
        "(consumers.config.ConsumersConfig, as orchard.run.settings.FullConfig types this section).",
    )
    log_format: Literal["auto", "console", "json"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment overrides the file's values (sources are deep-merged, first wins)."""
        return (env_settings, init_settings)


ConfigT = TypeVar("ConfigT", bound=OrchardConfig)


@functools.cache
def _explicit_only(schema: type[ConfigT]) -> type[ConfigT]:
    """``schema`` validating explicit values only, so command-line overrides win over the environment."""

    class ExplicitOnly(schema):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            """Only the values passed in."""
            return (init_settings,)

    return ExplicitOnly


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """Render pydantic errors as one line per field: ``bus.bootstrap_servers: Field required``."""
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "(root)"
        lines.append(f"  {field}: {err['msg']}")
    return "\n".join(lines)


def load_config(
    path: Path | None = None,
    *,
    schema: type[ConfigT] = OrchardConfig,  # type: ignore[assignment]
    **overrides: Any,
) -> ConfigT:
    """Load the config: YAML file, overlaid by ``ORCHARD_*`` environment variables, overlaid by keyword overrides.

    Each layer overlays the one below field by field, except that a section the layer gives another ``type`` is
    the layer's alone (the settings below are another backend's). ``schema`` is the model to validate with:
    ``OrchardConfig`` or an extension of it by the layers above. Raises ``ConfigError`` naming every bad field;
    nothing starts with an invalid config.
    """
    source = "environment" if path is None else str(path)
    layers = (_read_file(path) if path is not None else {}, EnvSettingsSource(schema)(), overrides)
    try:
        config = _explicit_only(schema)(**functools.reduce(_deep_merge, layers))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from exc
    values = {name: getattr(config, name) for name in schema.model_fields}
    return schema.model_construct(config.model_fields_set, **values)  # validated: an instance of ``schema`` itself


def _read_file(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"configuration {path} must be a mapping at the top level")
    return loaded


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base`` field by field; a section to which ``top`` gives another ``type`` is ``top``'s alone.

    >>> _deep_merge({"bus": {"type": "embedded", "path": "/b"}, "run_id": "r"}, {"bus": {"type": "kafka"}})
    {'bus': {'type': 'kafka'}, 'run_id': 'r'}
    """
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict) and not _retyped(below, value):
            out[key] = _deep_merge(below, value)
        else:
            out[key] = value
    return out


def _retyped(below: dict[str, Any], top: dict[str, Any]) -> bool:
    return "type" in below and "type" in top and below["type"] != top["type"]
