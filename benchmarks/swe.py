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
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from recipe_runs import (  # noqa: E402
    REPO,
    log_events,
    policy_lag_line,
    remap_ports,
    run_recipe,
    run_records,
    set_option,
    set_override,
    stage_walls,
    trainer_line,
)

sys.path.remove(str(Path(__file__).resolve().parent))

from orchard.run.recipe_layers import layered_recipe, replace_in_strings  # noqa: E402
from orchard.topics import OUTCOMES  # noqa: E402

RECIPE = REPO / "recipes" / "swe" / "local.yaml"
TRAINERS = ("trainer-credit", "trainer-rl", "trainer-dense")
ENVS = {"env": "demos", "rl-env": "rl-bar + dense", "eval-env": "evaluations"}


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    # templates expanded: every component spelled out. The copy lives beside the run directory: {recipe_dir} must
    # still name the recipe's own folder (its suite)
    recipe: dict[str, Any] = replace_in_strings(layered_recipe(RECIPE), "{recipe_dir}", str(RECIPE.parent))
    components = recipe["components"]
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    if args.max_steps is not None:
        tasks["max_steps"] = args.max_steps
    train = sum(
        1 for spec in (REPO / "recipes" / "swe" / "suite").glob("*/instance.yaml")
        if yaml.safe_load(spec.read_text())["split"] == "train"
    )  # fmt: skip
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = train * expert["episodes_per_task"]
    if args.sft_steps is not None:
        components["trainer-credit"]["set"] = set_override(components["trainer-credit"]["set"], "max_steps",
                                                           args.sft_steps)  # fmt: skip
    for name in ("rollout-rl", "rollout-dense"):
        if args.rl_rounds is not None:
            components[name]["rounds"] = args.rl_rounds
        if args.rl_budget is not None:
            components[name]["budget"] = args.rl_budget
    if args.max_tokens is not None:
        set_option(components["engine"]["args"], "--default-max-tokens", args.max_tokens)
    return remap_ports(recipe)


def report(run_dir: Path, wall_s: float) -> None:
    """Print the stages' wall times, the trainers' throughput, the episode throughput, and the results table."""
    walls = stage_walls(run_dir, wall_s)
    for name in TRAINERS:
        print(trainer_line(name, run_dir / name))
    policy_lag_line(run_dir, ("trainer-rl", "trainer-dense"))
    throughput(run_dir, walls)
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))
    plot = run_dir / "reward_curve.png"
    print(f"reward curve: {plot}" if plot.is_file() else "(no reward_curve.png)")


def stage_of(group_id: str) -> str:
    """Which kind of stage an episode's group belongs to."""
    if group_id.startswith("demo-"):
        return "demos"
    if group_id.startswith("eval-"):
        return "evaluations"
    return "rl-bar + dense"


def throughput(run_dir: Path, walls: dict[str, float]) -> None:
    """Episodes/hour and mean episode duration per kind of stage; sandbox set-up time per task."""
    durations: dict[str, list[float]] = defaultdict(list)
    for outcome in run_records(run_dir, OUTCOMES):
        started, ended = outcome.get("started_at"), outcome.get("ended_at")
        if isinstance(started, datetime) and isinstance(ended, datetime):
            durations[stage_of(str(outcome["group_id"]))].append((ended - started).total_seconds())
    seconds = {
        "demos": walls.get("demos", 0.0),
        "rl-bar + dense": walls.get("rl-bar", 0.0) + walls.get("dense", 0.0),
        "evaluations": sum(wall for name, wall in walls.items() if name.startswith("eval-")),
    }
    print("\n| episodes of | episodes | stage wall time (s) | episodes/hour | mean episode (s) |")
    print("|---|---|---|---|---|")
    for kind, wall in seconds.items():
        runs = durations.get(kind, [])
        rate = f"{len(runs) / wall * 3600:.0f}" if wall and runs else "-"
        mean = f"{statistics.fmean(runs):.1f}" if runs else "-"
        print(f"| {kind} | {len(runs)} | {wall:.0f} | {rate} | {mean} |")
    for component, kind in ENVS.items():
        setups = [float(e["ms"]) / 1000 for e in log_events(run_dir, component, "sandbox_created") if "ms" in e]
        if setups:
            setups.sort()
            mean, p50 = statistics.fmean(setups), setups[len(setups) // 2]
            print(f"sandbox set-up ({kind}, {component}): {len(setups)} sandboxes, mean {mean:.2f} s, "
                  f"p50 {p50:.2f} s, max {setups[-1]:.2f} s")  # fmt: skip


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime("swe-%Y%m%d-%H%M%S"))
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of each RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train instance.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    parser.add_argument("--duration", type=float, default=10800.0, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")
    parser.add_argument("--report", type=Path, help="Only print the figures of this finished (or resumed) run.")
    args = parser.parse_args()
    if args.report is not None:
        state = json.loads((args.report / "state.json").read_text())
        report(args.report.resolve(), time.time() - float(state.get("first_started_at") or time.time()))
        return 0 if state.get("status") == "completed" else 1
    run_dir = args.run_dir.resolve()
    code, wall_s = run_recipe(sized_recipe(args), run_dir, duration_s=args.duration, live=args.live)
    report(run_dir, wall_s)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
