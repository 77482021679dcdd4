"""A validation split carved from the train distribution: the tasks the train stream would have drawn next.

The RL settings of the recipe are chosen on this split, never on the held-out ``eval`` split (which each stage is
evaluated on once, with the shipped settings). ``generate_tasks`` draws the train split from one seeded stream after
the eval split and skips any task an earlier one repeats, so drawing ``train_tasks + N`` tasks gives the same first
``train_tasks`` and then ``N`` more, each different from every train and eval task: a split from the train
distribution that no stage trains on.

``python -m recipes.file_lookup.validation RUN_DIR [--tasks 200] [--recipe RUN_DIR/recipe.yaml] [generate options]``
writes ``RUN_DIR/validation/<task id>/`` (``overlays/ablation.yaml`` runs it as part of the setup stage). It is
idempotent: an existing split written with the same options is kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from orchard.logging import get_logger
from recipes.file_lookup.generate import LookupConfig, config_record, generate_tasks, write_task
from recipes.file_lookup.setup import RECIPE_BLOCKS
from recipes.model_options import add_model_options, model_from_options
from recipes.recipe_settings import add_recipe_option, parse_with_recipe

log = get_logger("recipes.file_lookup.validation")
PROG = "python -m recipes.file_lookup.validation"
VALIDATION_DIR = "validation"
MANIFEST = "manifest.json"


def write_validation(config: LookupConfig, out: Path, tasks: int) -> list[str]:
    """Write the ``tasks`` train-distribution tasks after ``config``'s train split to ``out``; their task ids."""
    wanted = {"config": config_record(config), "tasks": tasks}
    manifest = out / MANIFEST
    if manifest.is_file():
        written = json.loads(manifest.read_text())
        if {key: written.get(key) for key in wanted} == wanted:
            log.info("validation split already written, kept", out=str(out))
            return list(written["task_ids"])
        raise ValueError(f"{manifest} was written with other options ({written['config']}); use another directory")
    if out.exists():
        shutil.rmtree(out)  # a crash before the manifest left a partial split: start over
    drawn = generate_tasks(config.model_copy(update={"train_tasks": config.train_tasks + tasks}))["train"]
    carved = drawn[config.train_tasks :]
    for task in carved:
        write_task(task, config, out / task.task_id)
    ids = [task.task_id for task in carved]
    manifest.write_text(json.dumps({**wanted, "task_ids": ids}, indent=1) + "\n")
    log.info("validation split written", out=str(out), tasks=len(ids), first=ids[0] if ids else None)
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="The run directory (validation/ is written in it).")
    parser.add_argument("--tasks", type=int, default=200, help="Tasks in the validation split.")
    add_recipe_option(parser, "tasks: block")
    add_model_options(parser, LookupConfig)
    args = parse_with_recipe(parser, argv, {"tasks": RECIPE_BLOCKS["tasks"]})
    if args.tasks < 1:
        parser.error(f"--tasks must be at least 1, got {args.tasks}")
    write_validation(model_from_options(args, LookupConfig), args.run_dir / VALIDATION_DIR, args.tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
