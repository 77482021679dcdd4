"""Config: YAML, then environment, then explicit overrides; bad fields fail at start with their names."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchard.config import (
    EmbeddedBusConfig,
    KafkaBusConfig,
    LocalStoreConfig,
    OrchardConfig,
    S3StoreConfig,
    load_config,
)
from orchard.exceptions import ConfigError


def test_defaults_are_the_embedded_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHARD_BUS__TYPE", "ORCHARD_STORE__TYPE"):
        monkeypatch.delenv(name, raising=False)
    config = load_config()
    assert (config.bus.type, config.store.type) == ("embedded", "local")


def test_environment_overrides_the_file_and_overrides_beat_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "orchard.yaml"
    path.write_text("run_id: from-file\nbus:\n  type: kafka\n  bootstrap_servers: file:9092\n")
    monkeypatch.setenv("ORCHARD_BUS__BOOTSTRAP_SERVERS", "env:9092")
    config = load_config(path)
    assert isinstance(config.bus, KafkaBusConfig)
    assert (config.run_id, config.bus.bootstrap_servers) == ("from-file", "env:9092")
    overridden = load_config(path, run_id="cli", bus={"bootstrap_servers": "cli:9092"})
    assert isinstance(overridden.bus, KafkaBusConfig)
    assert (overridden.run_id, overridden.bus.bootstrap_servers) == ("cli", "cli:9092")


def test_secrets_come_from_the_environment_and_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_STORE__TYPE", "s3")
    monkeypatch.setenv("ORCHARD_STORE__ENDPOINT", "minio:9000")
    monkeypatch.setenv("ORCHARD_STORE__SECRET_KEY", "hunter2")
    config = load_config()
    assert isinstance(config.store, S3StoreConfig)
    assert config.store.secret_key.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(config)


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("bus:\n  type: embedded\n  default_partitions: 0\n", "bus.embedded.default_partitions"),
        ("bus:\n  type: rabbit\n", "bus"),
        ("store:\n  type: s3\n", "store.s3.endpoint"),
        ("run_id: 'has space'\n", "run_id"),
        ("unknown_section: 1\n", "unknown_section"),
    ],
)
def test_bad_values_name_their_field(tmp_path: Path, yaml_text: str, field: str) -> None:
    path = tmp_path / "orchard.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=rf"(?m)^  {field}(:| )"):
        load_config(path)


def test_unreadable_or_non_mapping_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_embedded_defaults_are_durable_against_a_killed_process() -> None:
    assert EmbeddedBusConfig().fsync == "never"
    assert EmbeddedBusConfig(fsync="always").fsync == "always"


def test_settings_without_a_type_are_the_default_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHARD_BUS__TYPE", "ORCHARD_STORE__TYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCHARD_BUS__PATH", str(tmp_path / "bus"))
    monkeypatch.setenv("ORCHARD_STORE__PATH", str(tmp_path / "store"))
    config = load_config()
    assert (config.bus, config.store) == (
        EmbeddedBusConfig(path=tmp_path / "bus"),
        LocalStoreConfig(path=tmp_path / "store"),
    )
    path = tmp_path / "orchard.yaml"
    path.write_text("bus:\n  default_partitions: 2\n")
    monkeypatch.delenv("ORCHARD_BUS__PATH")
    assert load_config(path).bus == EmbeddedBusConfig(default_partitions=2)


def test_settings_of_another_backend_without_a_type_say_which_type_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHARD_BUS__TYPE", "ORCHARD_STORE__TYPE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ORCHARD_BUS__BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("ORCHARD_STORE__ENDPOINT", "minio:9000")
    monkeypatch.setenv("ORCHARD_STORE__BUCKET", "runs")
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value) == (
        "invalid configuration in environment:\n"
        "  bus: 'type' is missing: bootstrap_servers is a setting of type 'kafka', not of the default type "
        "'embedded'; set type: kafka (environment: ORCHARD_BUS__TYPE=kafka); allowed types: 'embedded' (the default), "
        "'kafka'\n"
        "  store: 'type' is missing: bucket, endpoint are settings of type 's3', not of the default type 'local'; "
        "set type: s3 (environment: ORCHARD_STORE__TYPE=s3); allowed types: 'local' (the default), 's3'"
    )


@pytest.mark.parametrize(
    ("settings", "what"),
    [
        ({"NONSENSE": "1"}, "nonsense is a setting of no type"),
        ({"PATH": "/b", "PAHT": "/b", "BOOTSTRAP_SERVERS": "k:9092"}, "paht is a setting of no type"),
        ({"FSYNC": "always", "BOOTSTRAP_SERVERS": "k:9092"}, "no type has all of bootstrap_servers, fsync"),
    ],
    ids=["unknown", "unknown-among-known", "two-types"],
)
def test_settings_that_fit_no_single_type_say_type_is_missing_and_list_the_types(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], what: str
) -> None:
    monkeypatch.delenv("ORCHARD_BUS__TYPE", raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(f"ORCHARD_BUS__{name}", value)
    with pytest.raises(ConfigError) as caught:
        load_config()
    assert str(caught.value) == (
        "invalid configuration in environment:\n"
        f"  bus: 'type' is missing: {what}; set type (environment: ORCHARD_BUS__TYPE) and only that type's settings; "
        "allowed types: 'embedded' (the default), 'kafka'"
    )


def test_overrides_without_a_type_are_the_default_type_or_say_which_type_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORCHARD_BUS__TYPE", raising=False)
    monkeypatch.setenv("ORCHARD_BUS__FSYNC", "always")
    assert load_config(bus={"path": tmp_path}).bus == EmbeddedBusConfig(path=tmp_path, fsync="always")
    monkeypatch.delenv("ORCHARD_BUS__FSYNC")
    with pytest.raises(ConfigError) as caught:
        load_config(bus={"bootstrap_servers": "cli:9092"})
    assert str(caught.value) == (
        "invalid configuration in environment:\n"
        "  bus: 'type' is missing: bootstrap_servers is a setting of type 'kafka', not of the default type "
        "'embedded'; set type: kafka (environment: ORCHARD_BUS__TYPE=kafka); allowed types: 'embedded' (the default), "
        "'kafka'"
    )


def test_a_layer_that_changes_the_type_replaces_the_section_below(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ORCHARD_BUS__TYPE", "ORCHARD_BUS__BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "orchard.yaml"
    path.write_text("bus:\n  type: embedded\n  path: /data/bus\n  fsync: always\n")
    kafka = KafkaBusConfig(bootstrap_servers="k:9092")
    assert load_config(path, bus={"type": "kafka", "bootstrap_servers": "k:9092"}).bus == kafka
    monkeypatch.setenv("ORCHARD_BUS__TYPE", "kafka")
    monkeypatch.setenv("ORCHARD_BUS__BOOTSTRAP_SERVERS", "k:9092")
    assert load_config(path).bus == kafka
    assert load_config(path, bus={"type": "embedded"}).bus == EmbeddedBusConfig()  # nothing of the environment's


def test_a_loaded_config_is_an_instance_of_its_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_BUS__TYPE", raising=False)
    monkeypatch.setenv("ORCHARD_BUS__PATH", "/data/bus")
    config = load_config(run_id="cli")
    assert type(config) is OrchardConfig
    assert pickle.loads(pickle.dumps(config)) == config == OrchardConfig(run_id="cli")  # noqa: S301 - our own bytes


def test_a_kafka_assignment_strategy_other_than_range_is_refused_naming_the_option() -> None:
    with pytest.raises(ValidationError, match="partition.assignment.strategy must be range"):
        KafkaBusConfig(bootstrap_servers="localhost:9092",
                       client_options={"partition.assignment.strategy": "cooperative-sticky"})  # fmt: skip
    assert KafkaBusConfig(bootstrap_servers="b:1", client_options={"partition.assignment.strategy": "range"})
