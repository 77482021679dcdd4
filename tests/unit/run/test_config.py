"""Recipes of ``orchard run``: a bad recipe fails at start naming the field; defaults put bus and store in the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.config import EmbeddedBusConfig, KafkaBusConfig, LocalStoreConfig
from orchard.exceptions import ConfigError
from orchard.run.commands import component_args
from orchard.run.config import AliveHealth, HttpHealth, RestartPolicy, load_run_config, parse_run_config
from orchard.run.rundir import resolve_orchard_config


def recipe(**extra: Any) -> dict[str, Any]:
    return {
        "components": {
            "engine": {"kind": "scripted-engine", "plan": "plan.yaml", "port": 9001},
            "proxy": {"kind": "proxy", "backend": "engine", "port": 9002},
            "assembler": {"kind": "consumer", "name": "assembler", "after": ["proxy"]},
        },
        **extra,
    }


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_run_config(data, "recipe.yaml")
    return str(info.value)


def test_a_valid_recipe_starts_each_component_after_what_it_names() -> None:
    config = parse_run_config(recipe(), "recipe.yaml")
    assert config.start_order() == ["engine", "proxy", "assembler"]
    assert config.dependencies("proxy") == ["engine"]
    assert config.health_check("engine") == HttpHealth(path="/v1/models")
    assert config.health_check("proxy") == HttpHealth(path="/healthz")
    assert config.health_check("assembler") == AliveHealth()


def test_an_unknown_key_fails_naming_it() -> None:
    data = recipe()
    data["components"]["proxy"]["prot"] = 1
    assert "components.proxy.proxy.prot: Extra inputs are not permitted" in error_of(data)


def test_a_port_out_of_range_fails_naming_the_field() -> None:
    data = recipe()
    data["components"]["engine"]["port"] = 70000
    assert "components.engine.scripted-engine.port: Input should be less than or equal to 65535" in error_of(data)


def test_an_unknown_kind_fails_naming_the_component() -> None:
    data = recipe()
    data["components"]["engine"]["kind"] = "gpu-engine"
    assert "components.engine: Input tag 'gpu-engine' found using 'kind' does not match" in error_of(data)


def test_a_reference_to_a_missing_component_fails() -> None:
    data = recipe()
    data["components"]["proxy"]["backend"] = "vllm"
    assert "components.proxy: 'vllm' is not another component of this recipe" in error_of(data)


def test_a_dependency_cycle_fails_showing_the_cycle() -> None:
    data = recipe()
    data["components"]["engine"]["after"] = ["assembler"]
    assert "dependency cycle engine -> assembler -> proxy -> engine" in error_of(data)


def test_two_servers_on_one_port_fail() -> None:
    data = recipe()
    data["components"]["proxy"]["port"] = 9001
    assert "components.proxy.port: 9001 is also used by 'engine'" in error_of(data)


def test_a_bad_component_name_fails() -> None:
    data = recipe()
    data["components"]["Bad Name"] = {"kind": "consumer", "name": "assembler"}
    assert "component name 'Bad Name' must match" in error_of(data)


def test_stages_must_be_unique_and_name_components() -> None:
    assert "stages.1.name: stage 'sft' appears twice" in error_of(recipe(stages=[{"name": "sft"}, {"name": "sft"}]))
    bad = recipe(stages=[{"name": "rl", "components": ["trainer"]}])
    assert "stages.0.components: 'trainer' is not a component of this recipe" in error_of(bad)


def test_restart_limits_are_bounded() -> None:
    assert "restart.max_restarts: Input should be greater than or equal to 0" in error_of(
        recipe(restart={"max_restarts": -1})
    )


def test_restart_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=1.0, backoff_max_s=5.0)
    assert [policy.delay(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_relative_paths_are_relative_to_the_recipe_and_commands_match_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "components:\n"
        "  engine: {kind: scripted-engine, plan: plan.yaml, port: 9001}\n"
        "  proxy: {kind: proxy, backend: engine, port: 9002}\n"
        "  trainer: {kind: policy-trainer, config: t.yaml, set: [lr=1e-5]}\n"
    )
    config = load_run_config(path)
    run_dir = tmp_path / "run"
    assert component_args("engine", config.components["engine"], config, run_dir) == [
        "engine", "scripted", str(tmp_path / "plan.yaml"), "--host", "127.0.0.1", "--port", "9001",
        "--policy-version", "0",
    ]  # fmt: skip
    assert component_args("proxy", config.components["proxy"], config, run_dir) == [
        "proxy", "serve", "--backend", "http://127.0.0.1:9001/v1", "--host", "127.0.0.1", "--port", "9002",
    ]  # fmt: skip
    assert component_args("trainer", config.components["trainer"], config, run_dir) == [
        "train", "policy", "--config", str(tmp_path / "t.yaml"), "--set", "lr=1e-5",
    ]  # fmt: skip


def test_an_engines_cpu_threads_become_its_cpu_threads_option(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "components:\n  engine: {kind: engine, port: 9001, cpu_threads: 1}\n  other: {kind: engine, port: 9002}\n"
    )
    config = load_run_config(path)
    args = component_args("engine", config.components["engine"], config, tmp_path)
    assert args[args.index("--cpu-threads") + 1] == "1"
    assert "--cpu-threads" not in component_args("other", config.components["other"], config, tmp_path)


def test_recipe_dir_in_the_recorded_blocks_becomes_the_recipes_folder_for_the_setup_stage_that_reads_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "tasks: {suite: '{recipe_dir}/suite', splits: ['{recipe_dir}/a', 2], nested: {dir: '{recipe_dir}'}}\n"
        "expert: {plans: '{recipe_dir}/plans'}\n"
        "components: {assembler: {kind: consumer, name: assembler}}\n"
    )
    config = load_run_config(path)
    folder = str(tmp_path.resolve())
    assert config.tasks == {"suite": f"{folder}/suite", "splits": [f"{folder}/a", 2], "nested": {"dir": folder}}
    assert config.expert == {"plans": f"{folder}/plans"}
    assert parse_run_config({"tasks": {"suite": "{recipe_dir}/suite"}, **recipe()}, "r.yaml").tasks == {
        "suite": "{recipe_dir}/suite"  # no recipe folder given: nothing to replace it with
    }


def test_bus_and_store_default_to_the_run_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ORCHARD_BUS__TYPE", "ORCHARD_BUS__PATH", "ORCHARD_STORE__TYPE", "ORCHARD_STORE__PATH"):
        monkeypatch.delenv(name, raising=False)
    config = resolve_orchard_config(parse_run_config(recipe(), "r"), tmp_path / "my-run")
    assert config.run_id == "my-run"
    assert config.bus == EmbeddedBusConfig(path=(tmp_path / "my-run" / "bus").resolve())
    assert config.store == LocalStoreConfig(path=(tmp_path / "my-run" / "store").resolve())


def test_the_environment_switches_the_same_recipe_to_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_BUS__TYPE", "kafka")
    monkeypatch.setenv("ORCHARD_BUS__BOOTSTRAP_SERVERS", "broker:9092")
    config = resolve_orchard_config(parse_run_config(recipe(), "r"), tmp_path / "run")
    assert config.bus == KafkaBusConfig(bootstrap_servers="broker:9092")


def test_a_settings_file_replaces_the_bus_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_BUS__TYPE", raising=False)
    settings = tmp_path / "kafka.yaml"
    settings.write_text("bus: {type: kafka, bootstrap_servers: 'b:9092', replication_factor: 3}\n")
    config = resolve_orchard_config(parse_run_config(recipe(), "r"), tmp_path / "run", settings)
    assert config.bus == KafkaBusConfig(bootstrap_servers="b:9092", replication_factor=3)
