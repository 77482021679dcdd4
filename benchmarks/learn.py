"""The file-lookup recipe end to end through ``orchard run``: held-out results per stage and the wall time of each.

Runs ``recipes/file_lookup/recipe.yaml`` at a chosen size (its options rewritten into a copy of the recipe beside
the run directory; the servers get free ports), then prints the run's results table (``RUN_DIR/results.md``: held-out
success with a Wilson 95% interval and mean reward per evaluated stage), the wall time of every stage, each trainer's
steps and tokens/s, the RL stages' episodes/s and policy lag distribution, and where ``RUN_DIR/reward_curve.png`` is.
Not part of CI: the full recipe takes a long time on CPU.

    python benchmarks/learn.py [--run-dir runs/learn] [--train-tasks 1000] [--eval-tasks 256] [--steps N]
                               [--rl-rounds 8] [--rl-budget 64] [--episodes-per-task 1] [--imperfect-fraction 0.3]
                               [--lr 1e-3] [--batch-tokens 2048] [--cpu-threads 2] [--seed 0] [--duration 7200] [--live]

Without an option the recipe's own value is kept. ``--steps`` caps each SFT stage's optimizer steps. The exit status
is 0 only when every stage completed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_runs  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

from orchard.run.recipe_layers import layered_recipe  # noqa: E402
from orchard.topics import OUTCOMES  # noqa: E402

RECIPE = recipe_runs.REPO / "recipes" / "file_lookup" / "recipe.yaml"
SFT_TRAINERS = {"trainer": 1, "trainer-credit": 2}  # component -> how many SFT stages its max_steps spans
TRAINERS = ["trainer", "trainer-credit", "trainer-rl", "trainer-dense"]
RL_STAGES = ("rl-bar", "dense")
RL_GROUP = re.compile(r"^r\d{6}-")


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    components = recipe["components"]
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    sizes = {"train_tasks": args.train_tasks, "eval_tasks": args.eval_tasks, "seed": args.seed}
    tasks.update({key: value for key, value in sizes.items() if value is not None})
    demos = {"episodes_per_task": args.episodes_per_task, "imperfect_fraction": args.imperfect_fraction}
    expert.update({key: value for key, value in demos.items() if value is not None})
    setup = components["setup"]["run"]
    if "--recipe" not in setup:  # a setup command that still spells out its options: the same sizes there
        for flag, value in (("--train-tasks", tasks["train_tasks"]), ("--eval-tasks", tasks["eval_tasks"]),
                            ("--seed", tasks["seed"]), ("--episodes-per-task", expert["episodes_per_task"]),
                            ("--imperfect-fraction", expert["imperfect_fraction"])):  # fmt: skip
            recipe_runs.set_option(setup, flag, value)
    for name in TRAINERS:
        sft = name in SFT_TRAINERS
        sizes = {
            "lr": args.lr if sft else None,
            "batch_tokens": args.batch_tokens,
            "cpu_threads": args.cpu_threads,
            "max_steps": args.steps * SFT_TRAINERS[name] if args.steps and sft else None,
        }
        overrides = components[name]["set"]
        for key, value in sizes.items():
            overrides = overrides if value is None else recipe_runs.set_override(overrides, key, value)
        components[name]["set"] = overrides
    return recipe_runs.resized(
        recipe,
        demos=tasks["train_tasks"] * expert["episodes_per_task"],
        rollouts=("rollout-rl", "rollout-dense"),
        rl_rounds=args.rl_rounds,
        rl_budget=args.rl_budget,
    )


def report(run_dir: Path, wall_s: float) -> None:
    """Print the results table, the stages' wall times, the trainers' throughput, RL figures, and the plot's path."""
    walls = recipe_runs.stage_and_trainer_lines(run_dir, wall_s, TRAINERS)
    episodes = sum(
        1 for outcome in recipe_runs.run_records(run_dir, OUTCOMES) if RL_GROUP.match(str(outcome.get("group_id", "")))
    )
    seconds = sum(walls.get(stage, 0.0) for stage in RL_STAGES)
    rate = f"{episodes / seconds:.2f} episodes/s" if seconds else "episodes/s unknown"
    print(f"RL stages: {episodes} policy episodes in {seconds:.0f} s, {rate}")
    recipe_runs.policy_lag_line(run_dir, ("trainer-rl", "trainer-dense"))
    recipe_runs.results_table(run_dir)
    recipe_runs.reward_curve_line(run_dir)


def main() -> int:
    """Command line (see the module docstring)."""
    parser = recipe_runs.recipe_parser(__doc__.split("\n")[0], "learn")
    parser.add_argument("--train-tasks", type=int)
    parser.add_argument("--eval-tasks", type=int)
    parser.add_argument("--steps", type=int, help="Most optimizer steps of each SFT stage.")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of each RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train task.")
    parser.add_argument("--imperfect-fraction", type=float)
    parser.add_argument("--lr", type=float, help="Learning rate of the SFT stages.")
    parser.add_argument("--batch-tokens", type=int, help="Tokens per optimizer step.")
    parser.add_argument("--cpu-threads", type=int, help="torch threads of each trainer.")
    parser.add_argument("--seed", type=int, help="Seed of the task splits.")
    recipe_runs.add_run_options(parser, duration_s=7200.0)
    args = parser.parse_args()
    return recipe_runs.run_and_report(sized_recipe(args), args, report)


if __name__ == "__main__":
    raise SystemExit(main())
