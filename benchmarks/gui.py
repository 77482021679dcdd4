"""The Orchard-GUI recipe end to end through ``orchard run``: success per stage, throughput and browser start-up.

Runs ``recipes/gui/recipe.yaml`` (text mode: the accessibility-tree view only; a copy beside the run directory, with
free ports and the sizes given here), then prints the wall time of each stage, the trainers' tokens/s, the success
of every stage's episodes (demonstrations by kind, RL, each held-out evaluation with its Wilson interval from
``RUN_DIR/results.md``), and the episode throughput of this machine: episodes/hour per stage (the stage's episodes
over its wall time), the mean episode duration, the sandbox set-up time (the Env's ``sandbox_created`` log lines),
and the browser's start-up per episode: the time from the episode's start to its first model call on the bus
(sandbox, the apps server, Playwright and Chromium, the first page and its text view), and Chromium's own launch
through Playwright, measured with the harness's code (``recipes.gui.agent.Browser``) ``--launches`` times after the
run. Not part of CI.

    nice -n 10 python benchmarks/gui.py [--run-dir runs/gui] [--train-per-family 8] [--eval-per-family 4]
        [--episodes-per-task 2] [--rl-rounds 2] [--rl-budget 16] [--sft-steps 60] [--max-steps 8]
        [--max-tokens 96] [--launches 5] [--duration 3600] [--live]

Without an option the recipe's own value is kept. The exit status is 0 only when every stage completed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_runs  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

from orchard.run.recipe_layers import layered_recipe  # noqa: E402
from orchard.topics import MODEL_CALLS, OUTCOMES  # noqa: E402
from recipes.gui.setup import families_named  # noqa: E402

RECIPE = recipe_runs.REPO / "recipes" / "gui" / "recipe.yaml"
TRAINERS = ("trainer-credit", "trainer-rl")
ENVS = {"env": "demos", "rl-env": "rl-bar", "eval-env": "evaluations"}


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    for flag in ("train_per_family", "eval_per_family", "max_steps"):
        if getattr(args, flag) is not None:
            tasks[flag] = getattr(args, flag)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    families = families_named(tasks["families"])  # a list, or a name: all, cpu
    return recipe_runs.resized(
        recipe,
        demos=len(families) * tasks["train_per_family"] * expert["episodes_per_task"],
        rollouts=("rollout-rl",),
        rl_rounds=args.rl_rounds,
        rl_budget=args.rl_budget,
        sft_steps=args.sft_steps,
        max_tokens=args.max_tokens,
    )


def stage_of(group_id: str) -> str:
    """Which stage an episode's group belongs to."""
    return recipe_runs.stage_kind(group_id, "rl-bar")


def success_lines(run_dir: Path, outcomes: list[dict[str, Any]]) -> None:
    """Success of the demonstrations by kind and of the RL episodes (the evaluations are in results.md)."""
    kinds: dict[str, str] = {}
    demos = run_dir / "demos" / "demonstrations.jsonl"
    if demos.is_file():
        kinds = {e["episode_id"]: e["kind"] for e in map(json.loads, demos.read_text().splitlines())}
    rows: dict[str, list[bool]] = defaultdict(list)
    for outcome in outcomes:
        stage = stage_of(str(outcome["group_id"]))
        if stage == "demos":
            rows[f"demos ({kinds.get(outcome['episode_id'], '?')})"].append(bool(outcome["success"]))
        elif stage == "rl-bar":
            rows["rl-bar (policy's own train episodes)"].append(bool(outcome["success"]))
        else:
            rows["evaluations (every stage; each in results.md)"].append(bool(outcome["success"]))
    print("\n| episodes | n | succeeded | success |\n|---|---|---|---|")
    for name in sorted(rows):
        runs = rows[name]
        print(f"| {name} | {len(runs)} | {sum(runs)} | {sum(runs) / len(runs):.2f} |")


def throughput(run_dir: Path, walls: dict[str, float], outcomes: list[dict[str, Any]]) -> None:
    """Episodes/hour and mean episode duration per stage; sandbox set-up; time to the first model call."""
    durations: dict[str, list[float]] = defaultdict(list)
    started: dict[str, tuple[str, float]] = {}
    for outcome in outcomes:
        if (span := recipe_runs.outcome_span(outcome)) is not None:
            kind = stage_of(str(outcome["group_id"]))
            durations[kind].append(span[1] - span[0])
            started[str(outcome["episode_id"])] = (kind, span[0])
    recipe_runs.episode_table(durations, recipe_runs.walls_by_kind(walls, "rl-bar", ("rl-bar",)))
    recipe_runs.sandbox_setup_lines(run_dir, ENVS)
    first_call: dict[str, float] = {}
    for call in recipe_runs.run_records(run_dir, MODEL_CALLS):
        if call.get("call_index") == 0 and (at := recipe_runs.epoch_seconds(call.get("timestamp"))) is not None:
            first_call[str(call["episode_id"])] = at
    waits: dict[str, list[float]] = defaultdict(list)
    for episode_id, (kind, start) in started.items():
        if episode_id in first_call:
            waits[kind].append(first_call[episode_id] - start)
    for kind, values in waits.items():
        values.sort()
        print(f"episode start -> first model call ({kind}: sandbox + apps + Chromium + first page): {len(values)} "
              f"episodes, mean {statistics.fmean(values):.2f} s, p50 {values[len(values) // 2]:.2f} s, "
              f"max {values[-1]:.2f} s")  # fmt: skip


def launch_times(count: int) -> None:
    """Chromium's launch through Playwright, with the harness's own code, ``count`` times (and the first page)."""
    from recipes.gui.agent import Browser, BrowserSettings
    from recipes.gui.apps.server import AppHost, serve
    from recipes.gui.tasks import make_task

    task = make_task("docs_setting", "eval", 0, seed=0)
    server = serve(AppHost(task.world, None))
    url = f"http://127.0.0.1:{server.server_address[1]}"
    launches, firsts = [], []
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the apps server logs every request there
            for _ in range(count):
                started = time.perf_counter()
                browser = Browser(BrowserSettings(mode="text"), url)
                launched = time.perf_counter()
                browser.navigate(task.world["start_path"])
                browser.observe()
                firsts.append(time.perf_counter() - launched)
                launches.append(launched - started)
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    if launches:
        print(f"Chromium launch (Playwright + headless Chromium + new page, {count} launches after the run): mean "
              f"{statistics.fmean(launches):.2f} s, min {min(launches):.2f} s, max {max(launches):.2f} s; first page "
              f"+ text view mean {statistics.fmean(firsts):.2f} s")  # fmt: skip


def report(run_dir: Path, wall_s: float, launches: int) -> None:
    """Print the stages' wall times, the trainers' throughput, success, episode throughput and the results table."""
    walls = recipe_runs.stage_and_trainer_lines(run_dir, wall_s, TRAINERS)
    recipe_runs.policy_lag_line(run_dir, ("trainer-rl",))
    outcomes = list(recipe_runs.run_records(run_dir, OUTCOMES))
    success_lines(run_dir, outcomes)
    throughput(run_dir, walls, outcomes)
    if launches:
        launch_times(launches)
    recipe_runs.results_table(run_dir)


def main() -> int:
    """Command line (see the module docstring)."""
    parser = recipe_runs.recipe_parser(__doc__.split("\n")[0], "gui")
    parser.add_argument("--train-per-family", type=int, help="Train tasks per family.")
    parser.add_argument("--eval-per-family", type=int, help="Held-out tasks per family.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train task.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of the RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    parser.add_argument("--launches", type=int, default=5, help="Chromium launches measured after the run (0: none).")
    recipe_runs.add_run_options(parser, duration_s=3600.0)
    args = parser.parse_args()
    return recipe_runs.run_and_report(
        sized_recipe(args), args, lambda run_dir, wall_s: report(run_dir, wall_s, args.launches)
    )


if __name__ == "__main__":
    raise SystemExit(main())
