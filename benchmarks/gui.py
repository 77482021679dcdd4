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
from orchard.topics import MODEL_CALLS, OUTCOMES  # noqa: E402
from recipes.gui.setup import families_named  # noqa: E402

RECIPE = REPO / "recipes" / "gui" / "recipe.yaml"
TRAINERS = ("trainer-credit", "trainer-rl")
ENVS = {"env": "demos", "rl-env": "rl-bar", "eval-env": "evaluations"}


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    components = recipe["components"]
    tasks, expert = recipe["tasks"], recipe["expert"]  # what the setup stage reads (--recipe)
    for flag in ("train_per_family", "eval_per_family", "max_steps"):
        if getattr(args, flag) is not None:
            tasks[flag] = getattr(args, flag)
    if args.episodes_per_task is not None:
        expert["episodes_per_task"] = args.episodes_per_task
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            families = families_named(tasks["families"])  # a list, or a name: all, cpu
            stage["until"]["count"] = len(families) * tasks["train_per_family"] * expert["episodes_per_task"]
    if args.sft_steps is not None:
        components["trainer-credit"]["set"] = set_override(components["trainer-credit"]["set"], "max_steps",
                                                           args.sft_steps)  # fmt: skip
    if args.rl_rounds is not None:
        components["rollout-rl"]["rounds"] = args.rl_rounds
    if args.rl_budget is not None:
        components["rollout-rl"]["budget"] = args.rl_budget
    if args.max_tokens is not None:
        set_option(components["engine"]["args"], "--default-max-tokens", args.max_tokens)
    return remap_ports(recipe)


def stage_of(group_id: str) -> str:
    """Which stage an episode's group belongs to."""
    if group_id.startswith("demo-"):
        return "demos"
    if group_id.startswith("eval-"):
        return "evaluations"
    return "rl-bar"


def seconds(value: Any) -> float | None:
    """Epoch seconds of a decoded timestamp (a datetime, or epoch milliseconds)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value) / 1000
    return None


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
        start, end = seconds(outcome.get("started_at")), seconds(outcome.get("ended_at"))
        if start is not None and end is not None:
            kind = stage_of(str(outcome["group_id"]))
            durations[kind].append(end - start)
            started[str(outcome["episode_id"])] = (kind, start)
    walls_by_kind = {
        "demos": walls.get("demos", 0.0),
        "rl-bar": walls.get("rl-bar", 0.0),
        "evaluations": sum(wall for name, wall in walls.items() if name.startswith("eval-")),
    }
    print("\n| episodes of | episodes | stage wall time (s) | episodes/hour | mean episode (s) |")
    print("|---|---|---|---|---|")
    for kind, wall in walls_by_kind.items():
        runs = durations.get(kind, [])
        rate = f"{len(runs) / wall * 3600:.0f}" if wall and runs else "-"
        mean = f"{statistics.fmean(runs):.1f}" if runs else "-"
        print(f"| {kind} | {len(runs)} | {wall:.0f} | {rate} | {mean} |")
    for component, kind in ENVS.items():
        setups = sorted(float(e["ms"]) / 1000 for e in log_events(run_dir, component, "sandbox_created") if "ms" in e)
        if setups:
            print(f"sandbox set-up ({kind}, {component}): {len(setups)} sandboxes, "
                  f"mean {statistics.fmean(setups):.2f} s, p50 {setups[len(setups) // 2]:.2f} s, "
                  f"max {setups[-1]:.2f} s")  # fmt: skip
    first_call: dict[str, float] = {}
    for call in run_records(run_dir, MODEL_CALLS):
        if call.get("call_index") == 0 and (at := seconds(call.get("timestamp"))) is not None:
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
    walls = stage_walls(run_dir, wall_s)
    for name in TRAINERS:
        print(trainer_line(name, run_dir / name))
    policy_lag_line(run_dir, ("trainer-rl",))
    outcomes = list(run_records(run_dir, OUTCOMES))
    success_lines(run_dir, outcomes)
    throughput(run_dir, walls, outcomes)
    if launches:
        launch_times(launches)
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime("gui-%Y%m%d-%H%M%S"))
    parser.add_argument("--train-per-family", type=int, help="Train tasks per family.")
    parser.add_argument("--eval-per-family", type=int, help="Held-out tasks per family.")
    parser.add_argument("--episodes-per-task", type=int, help="Expert demonstrations per train task.")
    parser.add_argument("--max-steps", type=int, help="Model calls per episode.")
    parser.add_argument("--rl-rounds", type=int, help="BAR rounds of the RL stage.")
    parser.add_argument("--rl-budget", type=int, help="Episodes per BAR round.")
    parser.add_argument("--sft-steps", type=int, help="Most optimizer steps of credit SFT.")
    parser.add_argument("--max-tokens", type=int, help="The engine's completion length per call.")
    parser.add_argument("--launches", type=int, default=5, help="Chromium launches measured after the run (0: none).")
    parser.add_argument("--duration", type=float, default=3600.0, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")
    args = parser.parse_args()
    run_dir = args.run_dir.resolve()
    code, wall_s = run_recipe(sized_recipe(args), run_dir, duration_s=args.duration, live=args.live)
    report(run_dir, wall_s, args.launches)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
