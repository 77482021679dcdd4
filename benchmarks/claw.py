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
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

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

from orchard.run.recipe_layers import layered_recipe  # noqa: E402
from orchard.topics import OUTCOMES  # noqa: E402

RECIPE = REPO / "recipes" / "claw" / "recipe.yaml"
TRAINERS = ("trainer-credit", "trainer-rl")
ENVS = {"env": "demos", "rl-env": "rl-bar", "eval-env": "evaluations"}
KINDS = 8
"""Task kinds of the generator (``recipes.claw.tasks.KINDS``): train tasks = train_per_kind * KINDS."""


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    components = recipe["components"]
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    for flag in ("train_per_kind", "eval_per_kind", "max_steps"):
        if getattr(args, flag) is not None:
            tasks[flag] = getattr(args, flag)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    demos = tasks["train_per_kind"] * KINDS * expert["episodes_per_task"]
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = demos
    group_size = str(expert["episodes_per_task"])  # a task's demonstrations form one group
    components["builder-credit"]["env"]["ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE"] = group_size
    if args.sft_steps is not None:
        trainer = components["trainer-credit"]
        trainer["set"] = set_override(trainer["set"], "max_steps", args.sft_steps)
    if args.rl_rounds is not None:
        components["rollout-rl"]["rounds"] = args.rl_rounds
    if args.rl_budget is not None:
        components["rollout-rl"]["budget"] = args.rl_budget
    if args.max_tokens is not None:
        set_option(components["engine"]["args"], "--default-max-tokens", args.max_tokens)
    return remap_ports(recipe)


def report(run_dir: Path, wall_s: float) -> None:
    """Print the stages' wall times, the trainers' throughput, the episode throughput, and the results tables."""
    walls = stage_walls(run_dir, wall_s)
    for name in TRAINERS:
        print(trainer_line(name, run_dir / name))
    policy_lag_line(run_dir, ("trainer-rl",))
    throughput(run_dir, walls)
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))
    for stage in ("credit-sft", "rl-bar"):
        by_kind = by_kind_table(run_dir / "eval" / f"{stage}.md")
        if by_kind:
            print(f"{stage}, by task kind:\n{by_kind}\n")
    plot = run_dir / "reward_curve.png"
    print(f"reward curve: {plot}" if plot.is_file() else "(no reward_curve.png)")


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


def stage_of(group_id: str) -> str:
    """Which kind of stage an episode's group belongs to."""
    if group_id.startswith("demo-"):
        return "demos"
    if group_id.startswith("eval-"):
        return "evaluations"
    return "rl-bar"


def throughput(run_dir: Path, walls: dict[str, float]) -> None:
    """Episodes/hour, success and mean episode duration per kind of stage; sandbox set-up time."""
    durations: dict[str, list[float]] = defaultdict(list)
    successes: dict[str, int] = defaultdict(int)
    for outcome in run_records(run_dir, OUTCOMES):
        started, ended = outcome.get("started_at"), outcome.get("ended_at")
        kind = stage_of(str(outcome["group_id"]))
        successes[kind] += bool(outcome.get("success"))
        if isinstance(started, datetime) and isinstance(ended, datetime):
            durations[kind].append((ended - started).total_seconds())
    seconds = {
        "demos": walls.get("demos", 0.0),
        "rl-bar": walls.get("rl-bar", 0.0),
        "evaluations": sum(wall for name, wall in walls.items() if name.startswith("eval-")),
    }
    print("\n| episodes of | episodes | succeeded | stage wall time (s) | episodes/hour | mean episode (s) |")
    print("|---|---|---|---|---|---|")
    for kind, wall in seconds.items():
        runs = durations.get(kind, [])
        rate = f"{len(runs) / wall * 3600:.0f}" if wall and runs else "-"
        mean = f"{statistics.fmean(runs):.1f}" if runs else "-"
        print(f"| {kind} | {len(runs)} | {successes.get(kind, 0)} | {wall:.0f} | {rate} | {mean} |")
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
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime("claw-%Y%m%d-%H%M%S"))
    parser.add_argument("--train-per-kind", type=int, help="Train tasks of each of the 8 kinds.")
    parser.add_argument("--eval-per-kind", type=int, help="Held-out tasks of each kind.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train task.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of the RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    parser.add_argument("--duration", type=float, default=3600.0, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")
    args = parser.parse_args()
    run_dir = args.run_dir.resolve()
    code, wall_s = run_recipe(sized_recipe(args), run_dir, duration_s=args.duration, live=args.live)
    report(run_dir, wall_s)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
