"""The Orchard-SWE local recipe end to end through ``orchard run``: held-out resolved rate per stage, and throughput.

Runs ``recipes/swe/local.yaml`` (a copy beside the run directory, with free ports and the sizes given here), then
prints the run's results table (``RUN_DIR/results.md``: resolved rate on the held-out local suite with a Wilson 95%
interval per evaluated stage), the wall time of each stage, the trainers' tokens/s, and the episode throughput of
this machine: episodes/hour per stage (the stage's episodes over its wall time), the mean episode duration, and the
sandbox set-up time per task (the Env's ``sandbox_created`` log lines: copying the workspace, the git snapshot,
namespaces, the proxy door). Not part of CI: the recipe takes long on CPU.

    python benchmarks/swe.py [--run-dir runs/swe] [--rl-rounds 4] [--rl-budget 16] [--sft-steps 400]
                             [--episodes-per-task 2] [--max-steps 16] [--max-tokens 1536] [--duration 10800] [--live]
    python benchmarks/swe.py --report RUN_DIR     # the figures of a run already done (e.g. one finished by --resume)

Without an option the recipe's own value is kept. The exit status is 0 only when every stage completed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_runs  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

from orchard.run.recipe_layers import layered_recipe, replace_in_strings  # noqa: E402
from orchard.topics import OUTCOMES  # noqa: E402

RECIPE = recipe_runs.REPO / "recipes" / "swe" / "local.yaml"
TRAINERS = ("trainer-credit", "trainer-rl", "trainer-dense")
ENVS = {"env": "demos", "rl-env": "rl-bar + dense", "eval-env": "evaluations"}


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    # templates expanded: every component spelled out. The copy lives beside the run directory: {recipe_dir} must
    # still name the recipe's own folder (its suite)
    recipe: dict[str, Any] = replace_in_strings(layered_recipe(RECIPE), "{recipe_dir}", str(RECIPE.parent))
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    if args.max_steps is not None:
        tasks["max_steps"] = args.max_steps
    train = sum(
        1 for spec in (recipe_runs.REPO / "recipes" / "swe" / "suite").glob("*/instance.yaml")
        if yaml.safe_load(spec.read_text())["split"] == "train"
    )  # fmt: skip
    return recipe_runs.resized(
        recipe,
        demos=train * expert["episodes_per_task"],
        rollouts=("rollout-rl", "rollout-dense"),
        rl_rounds=args.rl_rounds,
        rl_budget=args.rl_budget,
        sft_steps=args.sft_steps,
        max_tokens=args.max_tokens,
    )


def report(run_dir: Path, wall_s: float) -> None:
    """Print the stages' wall times, the trainers' throughput, the episode throughput, and the results table."""
    walls = recipe_runs.stage_and_trainer_lines(run_dir, wall_s, TRAINERS)
    recipe_runs.policy_lag_line(run_dir, ("trainer-rl", "trainer-dense"))
    throughput(run_dir, walls)
    recipe_runs.results_table(run_dir)
    recipe_runs.reward_curve_line(run_dir)


def throughput(run_dir: Path, walls: dict[str, float]) -> None:
    """Episodes/hour and mean episode duration per kind of stage; sandbox set-up time per task."""
    durations: dict[str, list[float]] = defaultdict(list)
    for outcome in recipe_runs.run_records(run_dir, OUTCOMES):
        if (span := recipe_runs.outcome_span(outcome)) is not None:
            durations[recipe_runs.stage_kind(str(outcome["group_id"]), "rl-bar + dense")].append(span[1] - span[0])
    recipe_runs.episode_table(durations, recipe_runs.walls_by_kind(walls, "rl-bar + dense", ("rl-bar", "dense")))
    recipe_runs.sandbox_setup_lines(run_dir, ENVS)


def main() -> int:
    """Command line (see the module docstring)."""
    parser = recipe_runs.recipe_parser(__doc__.split("\n")[0], "swe")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of each RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train instance.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    recipe_runs.add_run_options(parser, duration_s=10800.0)
    parser.add_argument("--report", type=Path, help="Only print the figures of this finished (or resumed) run.")
    args = parser.parse_args()
    if args.report is not None:
        state = json.loads((args.report / "state.json").read_text())
        report(args.report.resolve(), time.time() - float(state.get("first_started_at") or time.time()))
        return 0 if state.get("status") == "completed" else 1
    return recipe_runs.run_and_report(sized_recipe(args), args, report)


if __name__ == "__main__":
    raise SystemExit(main())
