"""A recipe's setup command as it runs inside ``orchard run``: the run directory's copy of the recipe, written by the
same code ``orchard run`` uses (``RUN_DIR/recipe.yaml``: overlays and ``--set`` applied, templates expanded), and a
component's command line with ``{run_dir}`` standing for that directory."""

from __future__ import annotations

from pathlib import Path

from orchard.cli.run import _write_run_files
from orchard.config import OrchardConfig
from orchard.run.commands import component_command
from orchard.run.config import RunConfig
from orchard.run.rundir import RunDir


def write_run_copy(recipe: RunConfig, run_dir: Path) -> Path:
    """``run_dir/recipe.yaml`` exactly as ``orchard run`` writes it for ``recipe``; its path."""
    directory = RunDir(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_run_files(directory, recipe, OrchardConfig(), recipe_given=True)
    return directory.recipe


def module_argv(recipe: RunConfig, component: str, run_dir: Path) -> list[str]:
    """The arguments after ``python -m MODULE`` of command component ``component``, run in ``run_dir``."""
    command = component_command(component, recipe.components[component], recipe, run_dir)
    return command[command.index("-m") + 2 :]


def setup_in_run(recipe: RunConfig, component: str, run_dir: Path) -> list[str]:
    """The run's copy of ``recipe`` written to ``run_dir``, and the arguments of its setup command ``component``."""
    write_run_copy(recipe, run_dir)
    return module_argv(recipe, component, run_dir)
