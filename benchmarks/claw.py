"""The Orchard-Claw recipe end to end through ``orchard run``: held-out success per stage, and throughput.

Runs ``recipes/claw/recipe.yaml`` (a copy beside the run directory, with free ports and the sizes given here), then
prints the run's results table (``RUN_DIR/results.md``: success on the held-out Claw tasks with a Wilson 95% interval
per evaluated stage), the success by task kind of each evaluation (``RUN_DIR/eval/<stage>.md``), the wall time of
each stage, the trainers' tokens/s, and the episode throughput of this machine: episodes/hour per kind of stage (the
stage's episodes over its wall time), the mean episode duration, and the sandbox set-up time. Not part of CI.

    python benchmarks/claw.py [--run-dir runs/claw] [--train-per-kind 8] [--eval-per-kind 2] [--episodes-per-task 1]
                              [--max-steps 12] [--sft-steps 120] [--rl-rounds 2] [--rl-budget 16] [--max-tokens 128]
                              [--duration 3600] [--live]

Without an option the recipe's own value is kept. The exit status is 0 only when every stage completed.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_runs  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

from orchard.run.recipe_layers import layered_recipe  # noqa: E402
from orchard.topics import OUTCOMES  # noqa: E402

RECIPE = recipe_runs.REPO / "recipes" / "claw" / "recipe.yaml"
TRAINERS = ("trainer-credit", "trainer-rl")
ENVS = {"env": "demos", "rl-env": "rl-bar", "eval-env": "evaluations"}
KINDS = 8
"""Task kinds of the generator (``recipes.claw.tasks.KINDS``): train tasks = train_per_kind * KINDS."""


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    for flag in ("train_per_kind", "eval_per_kind", "max_steps"):
        if getattr(args, flag) is not None:
            tasks[flag] = getattr(args, flag)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    group_size = str(expert["episodes_per_task"])  # a task's demonstrations form one group
    recipe["components"]["builder-credit"]["env"]["ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE"] = group_size
    return recipe_runs.resized(
        recipe,
        demos=tasks["train_per_kind"] * KINDS * expert["episodes_per_task"],
        rollouts=("rollout-rl",),
        rl_rounds=args.rl_rounds,
        rl_budget=args.rl_budget,
        sft_steps=args.sft_steps,
        max_tokens=args.max_tokens,
    )


def report(run_dir: Path, wall_s: float) -> None:
    """Print the stages' wall times, the trainers' throughput, the episode throughput, and the results tables."""
    walls = recipe_runs.stage_and_trainer_lines(run_dir, wall_s, TRAINERS)
    recipe_runs.policy_lag_line(run_dir, ("trainer-rl",))
    throughput(run_dir, walls)
    recipe_runs.results_table(run_dir)
    for stage in ("credit-sft", "rl-bar"):
        by_kind = by_kind_table(run_dir / "eval" / f"{stage}.md")
        if by_kind:
            print(f"{stage}, by task kind:\n{by_kind}\n")
    recipe_runs.reward_curve_line(run_dir)


def by_kind_table(path: Path) -> str:
    """The "By kind" table of an evaluation's report (empty when there is none)."""
    if not path.is_file():
        return ""
    lines = path.read_text().splitlines()
    try:
        start = lines.index("## By kind") + 2
    except ValueError:
        return ""
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return "\n".join(table)


def throughput(run_dir: Path, walls: dict[str, float]) -> None:
    """Episodes/hour, success and mean episode duration per kind of stage; sandbox set-up time."""
    durations: dict[str, list[float]] = defaultdict(list)
    successes: dict[str, int] = defaultdict(int)
    for outcome in recipe_runs.run_records(run_dir, OUTCOMES):
        kind = recipe_runs.stage_kind(str(outcome["group_id"]), "rl-bar")
        successes[kind] += bool(outcome.get("success"))
        if (span := recipe_runs.outcome_span(outcome)) is not None:
            durations[kind].append(span[1] - span[0])
    recipe_runs.episode_table(durations, recipe_runs.walls_by_kind(walls, "rl-bar", ("rl-bar",)), successes)
    recipe_runs.sandbox_setup_lines(run_dir, ENVS)


def main() -> int:
    """Command line (see the module docstring)."""
    parser = recipe_runs.recipe_parser(__doc__.split("\n")[0], "claw")
    parser.add_argument("--train-per-kind", type=int, help="Train tasks of each of the 8 kinds.")
    parser.add_argument("--eval-per-kind", type=int, help="Held-out tasks of each kind.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train task.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of the RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    recipe_runs.add_run_options(parser, duration_s=3600.0)
    args = parser.parse_args()
    return recipe_runs.run_and_report(sized_recipe(args), args, report)


if __name__ == "__main__":
    raise SystemExit(main())
