"""``{url:NAME}`` in a command component: the URL of server component NAME, a dependency, checked at load."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from orchard.exceptions import ConfigError
from orchard.run.commands import component_args, component_command
from orchard.run.config import parse_run_config


def recipe(run: list[str], args: list[str] | None = None) -> dict[str, Any]:
    return {
        "components": {
            "engine": {"kind": "engine", "port": 9001, "host": "0.0.0.0"},  # noqa: S104 - never bound: it tests the URL
            "proxy": {"kind": "proxy", "backend": "engine", "port": 9002},
            "expert": {"kind": "command", "run": ["python", "-m", "expert"], "port": 9003},
            "assembler": {"kind": "consumer", "name": "assembler"},
            "eval": {"kind": "command", "run": run, "args": args or []},
        }
    }


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_run_config(data, "recipe.yaml")
    return str(info.value)


def test_url_placeholders_become_the_named_components_urls_in_run_and_args(tmp_path: Path) -> None:
    run = ["python", "-m", "evaluate", "--engine", "{url:engine}", "--proxy={url:proxy}/v1", "{run_dir}/out"]
    config = parse_run_config(recipe(run, args=["--expert", "{url:expert}"]), "recipe.yaml")
    command = component_command("eval", config.components["eval"], config, tmp_path)
    assert command == [
        sys.executable, "-m", "evaluate", "--engine", "http://127.0.0.1:9001",  # a wildcard bind is reached on loopback
        "--proxy=http://127.0.0.1:9002/v1", f"{tmp_path.resolve()}/out", "--expert", "http://127.0.0.1:9003",
    ]  # fmt: skip
    assert component_args("eval", config.components["eval"], config, tmp_path)[4] == "http://127.0.0.1:9001"


def test_the_named_components_are_dependencies_of_the_command() -> None:
    data = recipe(["orchard", "eval", "--env", "{url:proxy}", "--engine", "{url:engine}"], args=["{url:proxy}"])
    data["components"]["eval"]["after"] = ["assembler"]
    config = parse_run_config(data, "recipe.yaml")
    assert config.dependencies("eval") == ["assembler", "proxy", "engine"]
    assert config.start_order().index("eval") > config.start_order().index("proxy")


def test_an_unknown_component_fails_naming_the_field_and_the_placeholder() -> None:
    assert "components.eval.run: {url:engnie} names no other component of this recipe" in error_of(
        recipe(["orchard", "eval", "--engine", "{url:engnie}"])
    )
    assert "components.eval.args: {url:eval} names no other component of this recipe" in error_of(
        recipe(["orchard", "eval"], args=["{url:eval}"])
    )


def test_a_component_without_a_port_fails_as_it_has_no_url() -> None:
    message = error_of(recipe(["orchard", "eval", "{url:assembler}"]))
    assert "components.eval.run: {url:assembler} names component 'assembler', which is not a server" in message


def test_words_without_placeholders_are_unchanged(tmp_path: Path) -> None:
    config = parse_run_config(recipe(["tool", "{url}", "{other:engine}", "url:engine"]), "recipe.yaml")
    assert component_command("eval", config.components["eval"], config, tmp_path) == [
        "tool", "{url}", "{other:engine}", "url:engine",
    ]  # fmt: skip
    assert config.dependencies("eval") == []
