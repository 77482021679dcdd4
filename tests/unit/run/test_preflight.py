"""``orchard run``'s checks before anything starts: every shipped recipe passes them, bad settings are named."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from orchard.exceptions import ConfigError
from orchard.run.config import load_run_config, parse_run_config
from orchard.run.preflight import check_components, component_problems, port_taken

REPO = Path(__file__).resolve().parents[3]
RECIPES = sorted(p for p in REPO.glob("recipes/*/*.yaml") if "components" in (yaml.safe_load(p.read_text()) or {}))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "orchard.yaml"
    path.write_text(f"bus: {{type: embedded, path: {tmp_path / 'bus'}}}\n")
    return path


@pytest.mark.parametrize("recipe", RECIPES, ids=[f"{p.parent.name}/{p.stem}" for p in RECIPES])
def test_every_shipped_recipes_components_pass_the_checks(recipe: Path, tmp_path: Path, config_file: Path) -> None:
    assert component_problems(load_run_config(recipe), tmp_path / "run", config_file) == []


def test_every_bad_setting_is_reported_with_its_component_and_field(tmp_path: Path, config_file: Path) -> None:
    config = parse_run_config(
        {
            "components": {
                "trainer": {"kind": "policy-trainer", "set": ["lr=fast", "run_dir={run_dir}/t"]},
                "other": {"kind": "policy-trainer", "config": "{run_dir}/missing.yaml"},
                "builder": {"kind": "consumer", "name": "assembler", "env": {"ORCHARD_RUN_ID": "no spaces allowed"}},
            }
        },
        "recipe.yaml",
        tmp_path,
    )
    problems = component_problems(config, tmp_path / "run", config_file)

    assert len(problems) == 3, problems
    assert problems[0].startswith("component 'trainer': set:") and "lr: Input should be a valid number" in problems[0]
    assert problems[1] == f"component 'other': config: no such file {(tmp_path / 'run').resolve()}/missing.yaml"
    assert problems[2].startswith("component 'builder': env:") and "run_id" in problems[2]
    with pytest.raises(ConfigError, match="would not start"):
        check_components(config, tmp_path / "run", config_file)


def test_a_port_is_taken_only_while_something_accepts_on_it() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert not port_taken("127.0.0.1", port)  # bound, not listening: nobody answers
        listener.listen()
        assert port_taken("127.0.0.1", port) and port_taken("0.0.0.0", port)  # noqa: S104
    assert not port_taken("127.0.0.1", port)
