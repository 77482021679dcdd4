"""The shipped recipes written with templates stand for exactly the recipes they replace: each, expanded as
``orchard run`` expands it (``layered_recipe``: templates and ``{run_id}`` filled in, before validation), equals its
frozen snapshot in ``snapshots/``, and none keeps a template no component uses.

The snapshots were checked by hand against the recipes as they were before their templates (git 2c776ea, each
expanded the same way): equal but for the setup components, which now read the recipe (``--recipe
{run_dir}/recipe.yaml``; ``test_recipe_settings.py`` checks that they run with the same settings as before), and the
settings their ``tasks:``/``expert:`` blocks gained from those command lines. A deliberate change to one of these
recipes rewrites its snapshot: ``.venv/bin/python -m tests.unit.recipes.test_recipe_templates``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.run.config import load_run_config
from orchard.run.recipe_layers import layered_recipe

ROOT = Path(__file__).resolve().parents[3]
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
RECIPES = {
    "claw": "recipes/claw/recipe.yaml",
    "file-lookup": "recipes/file_lookup/recipe.yaml",
    "gui": "recipes/gui/recipe.yaml",
    "imported-sft": "recipes/imported_sft/recipe.yaml",
    "swe-cluster": "recipes/swe/cluster.yaml",
    "swe-local": "recipes/swe/local.yaml",
}
"""Snapshot name -> recipe (file_lookup's recipe joins them once its setup reads it too)."""


def expanded(name: str) -> dict[str, Any]:
    """The recipe ``name`` as ``orchard run`` expands it."""
    return layered_recipe(ROOT / RECIPES[name])


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_recipe_expands_to_its_snapshot(name: str) -> None:
    assert expanded(name) == json.loads((SNAPSHOTS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_template_is_used_and_the_expanded_recipe_validates(name: str) -> None:
    raw = yaml.safe_load((ROOT / RECIPES[name]).read_text())
    templates = raw.get("templates", {})
    named = {spec.get("template") for spec in [*raw["components"].values(), *templates.values()]}
    assert sorted(set(templates) - named) == []
    load_run_config(ROOT / RECIPES[name])  # raises, naming the field, if an expansion is not a valid recipe


def write_snapshots() -> None:
    """Rewrite every snapshot from the recipe as it is now."""
    SNAPSHOTS.mkdir(exist_ok=True)
    for name in RECIPES:
        (SNAPSHOTS / f"{name}.json").write_text(json.dumps(expanded(name), indent=1) + "\n")


if __name__ == "__main__":
    write_snapshots()
