"""The setup stage of the Claw recipe: the task splits, and the expert's demonstration plans, in one command.

``python -m recipes.claw.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [--seed 0] [--train-per-kind 8]
[--eval-per-kind 2] [--max-steps 12] [--harness-timeout-s 300] [--grade-timeout-s 60] [--memory-mb 0]
[--episodes-per-task 1] [--wrong-fraction 0.25] [--expert-seed 0]`` writes

- ``RUN_DIR/tasks/{train,eval}/<task_id>/``, ``RUN_DIR/tasks/manifest.json`` and the reference and wrong solutions
  ``RUN_DIR/tasks/solutions/<split>/<task_id>.json`` (``recipes.claw.tasks``): no solution is inside a task
  directory, and the recipe's Envs hide ``RUN_DIR/tasks/solutions`` (``SOLUTIONS``) from every sandbox;
- ``RUN_DIR/demos/plans/<episode_id>.yaml``: the scripted expert's plan of every demonstration (``recipes.claw.expert``;
  hidden from sandboxes too), and ``RUN_DIR/demos/demonstrations.jsonl`` (episode id, task id, ``solution``:
  ``reference`` or ``wrong``), which ``orchard rollout run --demos`` submits and
  ``orchard engine expert`` serves.

Every train task gets ``episodes_per_task`` demonstrations; each replays the task's wrong solution with probability
``wrong_fraction`` (a pure function of the expert seed and the episode id), else its reference. A wrong one is graded
as a failure with partial progress (the ``progress`` signal): material for credit-assignment SFT.

With ``--recipe`` the options' defaults are the recipe's ``tasks:`` (every ``ClawConfig`` field by name) and
``expert:`` blocks (``episodes_per_task``, ``wrong_fraction``, ``seed``), ``recipes.recipe_settings``: the recipe's
setup component passes ``--recipe {run_dir}/recipe.yaml`` and repeats none of them.

It is idempotent, so a restarted or resumed stage does not fail on its own output: tasks already generated with the
same options are kept (other options: an error naming the manifest), and the plans are rewritten (a pure function
of the tasks and the expert's options). Plans and tasks are checked against each other: a solution longer than the
tasks' ``max_steps`` allows (its tool calls and the ``submit``) is an error naming the task.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.logging import get_logger
from recipes.claw.expert import write_demonstrations
from recipes.claw.tasks import SOLUTIONS_DIR, ClawConfig, generate
from recipes.recipe_settings import Block, add_recipe_option, parse_with_recipe

log = get_logger("recipes.claw.setup")
PROG = "python -m recipes.claw.setup"
TASKS_DIR = "tasks"
DEMOS_DIR = "demos"
SOLUTIONS = f"{TASKS_DIR}/{SOLUTIONS_DIR}"
"""Where the solutions are, relative to the run directory (what the recipe's Envs ``--hide``)."""
RECIPE_MAX_STEPS = 12
"""Model calls per episode in the recipe: the longest solution (9 tool calls) and ``submit``, with a little slack."""
RECIPE_BLOCKS = {
    "tasks": Block(
        options={name: name for name in ClawConfig.model_fields}, recorded={"generator": "recipes.claw.tasks"}
    ),
    "expert": Block(
        options={"episodes_per_task": "episodes_per_task", "wrong_fraction": "wrong_fraction", "seed": "expert_seed"},
        recorded={"module": "recipes.claw.expert"},
    ),
}
"""What ``--recipe`` reads: block key -> option (``recipes.recipe_settings``)."""


def check_fits(tasks: Path, max_steps: int) -> None:
    """Raise ``ValueError`` naming the first task whose reference or wrong solution needs more than ``max_steps``
    model calls (one per tool call, then ``submit``)."""
    for path in sorted((tasks / SOLUTIONS_DIR).glob("*/*.json")):
        solutions = json.loads(path.read_text(encoding="utf-8"))
        for which in ("reference", "wrong"):
            needed = len(solutions[which]) + 1
            if needed > max_steps:
                raise ValueError(
                    f"--max-steps {max_steps}: the {which} solution of {solutions['task_id']} needs {needed} model "
                    "calls; raise --max-steps"
                )


def setup(
    run_dir: Path,
    config: ClawConfig,
    episodes_per_task: int = 1,
    wrong_fraction: float = 0.25,
    expert_seed: int = 0,
) -> tuple[Path, Path]:
    """Generate the tasks and plan the demonstrations under ``run_dir``; returns (tasks dir, demos dir)."""
    if episodes_per_task < 1:
        raise ValueError(f"--episodes-per-task {episodes_per_task}: must be at least 1")
    if not 0.0 <= wrong_fraction <= 1.0:
        raise ValueError(f"--wrong-fraction {wrong_fraction}: must be within [0, 1]")
    tasks, demos = run_dir / TASKS_DIR, run_dir / DEMOS_DIR
    manifest = tasks / "manifest.json"
    if manifest.is_file():
        written = json.loads(manifest.read_text())["config"]
        if written != config.model_dump():
            raise ValueError(f"{manifest} was generated with other options ({written}); use another run directory")
        log.info("claw tasks already generated, kept", tasks=str(tasks))
        check_fits(tasks, config.max_steps)
    else:
        generate(config, tasks, overwrite=True)  # a crash before the manifest leaves a partial tree: start over
        try:
            check_fits(tasks, config.max_steps)
        except ValueError:
            shutil.rmtree(tasks)  # tasks no episode could solve: leave nothing a corrected command would refuse
            raise
    if (demos / "plans").exists():
        shutil.rmtree(demos / "plans")  # plans of other options must not linger (the backend serves every file there)
    lines = write_demonstrations(tasks, demos, "train", episodes_per_task, wrong_fraction, expert_seed)
    counts: dict[str, Any] = {kind: sum(line["solution"] == kind for line in lines) for kind in ("reference", "wrong")}
    log.info("claw demonstrations planned", demos=str(demos), episodes=len(lines), **counts)
    return tasks, demos


def setup_arguments(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``setup`` that the command line ``argv`` asks for (``ValueError``: invalid ones)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="The run directory (tasks/ and demos/ are written in it).")
    add_recipe_option(parser, "tasks: and expert: blocks")
    for name, spec in ClawConfig.model_fields.items():
        default = RECIPE_MAX_STEPS if name == "max_steps" else spec.default
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(spec.default), default=default,
                            help=f"{spec.description} (default: {default})")  # fmt: skip
    parser.add_argument("--episodes-per-task", type=int, default=1, help="Demonstrations per train task.")
    parser.add_argument("--wrong-fraction", type=float, default=0.25, help="Chance a demonstration is a wrong one.")
    parser.add_argument("--expert-seed", type=int, default=0, help="Seed of the expert's choice of wrong ones.")
    args = parse_with_recipe(parser, argv, RECIPE_BLOCKS)
    return {
        "run_dir": args.run_dir,
        "config": ClawConfig(**{name: getattr(args, name) for name in ClawConfig.model_fields}),
        "episodes_per_task": args.episodes_per_task,
        "wrong_fraction": args.wrong_fraction,
        "expert_seed": args.expert_seed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.claw.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [options]``."""
    try:
        setup(**setup_arguments(argv))
    except ValueError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        raise SystemExit(2) from exc
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
