"""The setup stage of the file-lookup recipe: the task splits and the expert's demonstration plans, in one command.

``python -m recipes.file_lookup.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [--train-tasks 1000] [--eval-tasks 256]
[--seed 0] [--episodes-per-task 1] [--imperfect-fraction 0.3] [--expert-seed 0] [--files-per-task 3]
[--keys-per-file 2] [--max-steps 6] [--hops 1] [--validation-tasks 0]`` writes ``RUN_DIR/tasks/{train,eval}/`` and
``RUN_DIR/tasks/manifest.json`` (``generate``) and ``RUN_DIR/demos/plans/*.yaml`` +
``RUN_DIR/demos/demonstrations.jsonl`` (``expert plan`` over the train split). ``--validation-tasks N`` also writes
a validation split of ``N`` train-distribution tasks to ``RUN_DIR/validation/`` (``recipes.file_lookup.validation``;
``overlays/validation.yaml`` evaluates every stage on it).

With ``--recipe`` the options' defaults are the recipe's ``tasks:`` (every ``LookupConfig`` field by name) and
``expert:`` blocks (``seed``, ``episodes_per_task``, ``imperfect_fraction``), ``recipes.recipe_settings``: the recipe's
setup component passes ``--recipe {run_dir}/recipe.yaml`` and repeats none of them.

It is idempotent, so a restarted or resumed stage does not fail on its own output: tasks already generated with the
same options are kept (other options: an error naming the manifest), and the plans are rewritten (they are a pure
function of the tasks and the expert's options).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.logging import get_logger
from recipes.file_lookup.expert import Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import LookupConfig, config_record, generate
from recipes.model_options import add_model_options, model_from_options
from recipes.recipe_settings import Block, add_recipe_option, parse_with_recipe

log = get_logger("recipes.file_lookup.setup")
PROG = "python -m recipes.file_lookup.setup"
TASKS_DIR = "tasks"
DEMOS_DIR = "demos"
RECIPE_BLOCKS = {
    "tasks": Block(
        options={name: name for name in LookupConfig.model_fields},
        recorded={"generator": "recipes.file_lookup.generate", "dir": TASKS_DIR},
    ),
    "expert": Block(
        options={
            "seed": "expert_seed",
            "episodes_per_task": "episodes_per_task",
            "imperfect_fraction": "imperfect_fraction",
        },
        recorded={"module": "recipes.file_lookup.expert"},
    ),
}
"""What ``--recipe`` reads: block key -> option (``recipes.recipe_settings``)."""


def setup(
    run_dir: Path, lookup: LookupConfig, expert: ExpertConfig, episodes_per_task: int = 1, validation_tasks: int = 0
) -> tuple[Path, Path]:
    """Write the tasks and the demonstration plans under ``run_dir`` (and a validation split of ``validation_tasks``
    tasks, if any); return (tasks dir, demos dir)."""
    tasks, demos = run_dir / TASKS_DIR, run_dir / DEMOS_DIR
    manifest = tasks / "manifest.json"
    if manifest.is_file():
        written = json.loads(manifest.read_text())["config"]
        if written != config_record(lookup):
            raise ValueError(f"{manifest} was generated with other options ({written}); use another run directory")
        log.info("tasks already generated, kept", tasks=str(tasks))
    else:
        generate(lookup, tasks, overwrite=True)  # a crash before the manifest leaves a partial tree: start over
    write_demonstrations(tasks / "train", demos, Expert(expert), episodes_per_task)
    if validation_tasks:
        # imported here: the validation module reads this module's recipe blocks for its own command line
        from recipes.file_lookup.validation import VALIDATION_DIR, write_validation

        write_validation(lookup, run_dir / VALIDATION_DIR, validation_tasks)
    return tasks, demos


def setup_arguments(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``setup`` that the command line ``argv`` asks for."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="The run directory (tasks/ and demos/ are written in it).")
    add_recipe_option(parser, "tasks: and expert: blocks")
    add_model_options(parser, LookupConfig)
    parser.add_argument("--episodes-per-task", type=int, default=1, help="Demonstrations per train task.")
    parser.add_argument("--imperfect-fraction", type=float, default=ExpertConfig().imperfect_fraction)
    parser.add_argument("--expert-seed", type=int, default=0, help="Seed of the expert's choice of kinds.")
    parser.add_argument(
        "--validation-tasks", type=int, default=0, help="Also write a validation split of this many tasks (0: none)."
    )
    args = parse_with_recipe(parser, argv, RECIPE_BLOCKS)
    if args.validation_tasks < 0:
        parser.error(f"--validation-tasks must be 0 or more, got {args.validation_tasks}")
    return {
        "run_dir": args.run_dir,
        "lookup": model_from_options(args, LookupConfig),
        "expert": ExpertConfig(seed=args.expert_seed, imperfect_fraction=args.imperfect_fraction),
        "episodes_per_task": args.episodes_per_task,
        "validation_tasks": args.validation_tasks,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.file_lookup.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [options]``."""
    setup(**setup_arguments(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
