"""Recipe layers: overlays merged by key, ``--set`` edits, templates with parameters, and ``{run_id}``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchard.exceptions import ConfigError
from orchard.run.config import load_run_config
from orchard.run.recipe_layers import apply_set, expand_templates, layered_recipe, merge

BASE = {
    "run_id": "demo",
    "components": {
        "engine": {"kind": "scripted-engine", "plan": "plan.yaml", "port": 8000},
        "proxy": {"kind": "proxy", "backend": "engine", "port": 8100},
    },
    "restart": {"max_restarts": 5, "backoff_s": 1},
}


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_overlay_merges_mappings_by_key_and_replaces_lists_and_scalars_whole() -> None:
    base = {"a": {"x": 1, "y": [1, 2], "z": {"k": 1}}, "b": 2}
    merged = merge(base, {"a": {"y": [3], "z": {"j": 2}, "w": None}, "c": 3})
    assert merged == {"a": {"x": 1, "y": [3], "z": {"k": 1, "j": 2}, "w": None}, "b": 2, "c": 3}
    assert base == {"a": {"x": 1, "y": [1, 2], "z": {"k": 1}}, "b": 2}  # untouched


@pytest.mark.parametrize(
    ("assignment", "expected"),
    [
        ("restart.max_restarts=0", {"max_restarts": 0, "backoff_s": 1}),
        ("restart.backoff_s=[1, 2]", {"max_restarts": 5, "backoff_s": [1, 2]}),
        ("restart.policy='10'", {"max_restarts": 5, "backoff_s": 1, "policy": "10"}),
        ("restart.new.deep=null", {"max_restarts": 5, "backoff_s": 1, "new": {"deep": None}}),
    ],
)
def test_set_reads_its_value_as_yaml_and_creates_missing_mappings(assignment: str, expected: object) -> None:
    assert apply_set(BASE, assignment)["restart"] == expected
    assert BASE["restart"] == {"max_restarts": 5, "backoff_s": 1}


def test_set_indexes_lists_by_number() -> None:
    data = {"stages": [{"name": "a"}, {"name": "b"}]}
    assert apply_set(data, "stages.1.name=c") == {"stages": [{"name": "a"}, {"name": "c"}]}


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("restart", "expected PATH=VALUE"),
        ("restart..x=1", "expected PATH=VALUE"),
        ("stages.5.name=x", "stages.5 is not an index of a list of 2"),
        ("stages.name=x", "stages.name is not an index"),
        ("run_id.x=1", "run_id is a str, not a mapping"),
        ("run_id=[unclosed", "the value is not YAML"),
    ],
)
def test_a_bad_set_fails_naming_its_path(assignment: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("[", r"\[")):
        apply_set({**BASE, "stages": [{}, {}]}, assignment)


def test_a_component_built_from_a_template_is_the_template_with_its_own_keys_and_params_merged_over() -> None:
    data = {
        "templates": {
            "base": {"kind": "command", "restart": {"policy": "never"}, "run": ["echo", "{param:word}"]},
            "loud": {"template": "base", "env": {"LOUD": "1"}},
        },
        "components": {
            "a": {"template": "loud", "params": {"word": "hi"}, "restart": {"max_restarts": 1}},
            "b": {"kind": "command", "run": ["true"]},
        },
    }
    expanded = expand_templates(data)
    assert "templates" not in expanded
    assert expanded["components"] == {
        "a": {"kind": "command", "restart": {"policy": "never", "max_restarts": 1}, "run": ["echo", "hi"],
              "env": {"LOUD": "1"}},
        "b": {"kind": "command", "run": ["true"]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("templates", "component", "message"),
    [
        ({}, {"template": "nope"}, r"components\.a\.template: no template 'nope' \(known: none\)"),
        ({"x": {"template": "y"}, "y": {"template": "x"}}, {"template": "x"}, "cycle: x -> y -> x"),
        ({"x": {"run": ["{param:p}"]}}, {"template": "x"}, r"components\.a: uses \{param:p\} but its params give"),
        ({"x": {"run": ["a"]}}, {"template": "x", "params": {"p": 1}}, r"components\.a\.params: p used by no"),
        ({"x": ["not", "a", "mapping"]}, {"template": "x"}, r"templates\.x: must be a mapping"),
    ],
)
def test_a_bad_template_or_parameter_fails_naming_the_component(
    templates: dict[str, object], component: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_templates({"templates": templates, "components": {"a": component}})


def test_run_id_fills_its_placeholder_and_a_recipe_using_it_without_one_is_refused(tmp_path: Path) -> None:
    data = {"components": {"a": {"kind": "command", "run": ["echo", "{run_id}"]}}}
    filled = layered_recipe(write(tmp_path / "r.yaml", {**data, "run_id": "exp-1"}))
    assert filled["components"]["a"]["run"] == ["echo", "exp-1"]
    with pytest.raises(ConfigError, match=r"uses \{run_id\} but sets no run_id"):
        layered_recipe(write(tmp_path / "s.yaml", data))
    assert layered_recipe(tmp_path / "s.yaml", sets=["run_id=exp-2"])["components"]["a"]["run"] == ["echo", "exp-2"]


def test_overlays_then_sets_apply_in_order_and_validation_names_the_field(tmp_path: Path) -> None:
    recipe = write(tmp_path / "recipe.yaml", BASE)
    (tmp_path / "plan.yaml").write_text("steps: []\n")
    small = write(tmp_path / "small.yaml", {"components": {"proxy": {"port": 8200}}, "restart": {"max_restarts": 1}})
    later = write(tmp_path / "later.yaml", {"restart": {"max_restarts": 2}})
    config = load_run_config(recipe, [small, later], ["components.engine.port=8001"])
    assert (config.components["proxy"].port, config.restart.max_restarts) == (8200, 2)
    assert config.components["engine"].port == 8001
    assert config.components["engine"].plan == (tmp_path / "plan.yaml").resolve()  # relative to the base recipe
    with pytest.raises(ConfigError, match=r"components\.engine\.port") as error:
        load_run_config(recipe, sets=["components.engine.port=not-a-port"])
    assert "--set components.engine.port=not-a-port" in str(error.value)


def test_an_overlay_that_is_not_a_mapping_is_refused_naming_it(tmp_path: Path) -> None:
    recipe = write(tmp_path / "recipe.yaml", BASE)
    overlay = tmp_path / "bad.yaml"
    overlay.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"overlay .*bad\.yaml must be a mapping"):
        load_run_config(recipe, [overlay])


def test_a_component_set_to_null_is_removed_and_a_stage_still_naming_it_fails_naming_both(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text("steps: []\n")
    recipe = write(tmp_path / "recipe.yaml", BASE)
    trim = write(tmp_path / "trim.yaml", {"components": {"proxy": None}})
    assert sorted(load_run_config(recipe, [trim]).components) == ["engine"]
    assert sorted(load_run_config(recipe, sets=["components.proxy=null"]).components) == ["engine"]
    staged = write(tmp_path / "staged.yaml", {**BASE, "stages": [{"name": "serve", "components": ["proxy"]}]})
    with pytest.raises(ConfigError, match=r"stages\.0\.components: 'proxy' is not a component"):
        load_run_config(staged, [trim])
