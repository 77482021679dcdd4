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
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "file_lookup" / "recipe.yaml"
SFT_TRAINERS = {"trainer": 1, "trainer-credit": 2}  # component -> how many SFT stages its max_steps spans
TRAINERS = ["trainer", "trainer-credit", "trainer-rl", "trainer-dense"]
RL_STAGES = ("rl-bar", "dense")
RL_GROUP = re.compile(r"^r\d{6}-")


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def set_option(words: list[str], flag: str, value: object) -> None:
    """Replace the value after ``flag`` in a command line (the flag must be there)."""
    words[words.index(flag) + 1] = str(value)


def set_override(overrides: list[str], key: str, value: object) -> list[str]:
    """``overrides`` with ``key=value`` replacing any earlier override of ``key``."""
    return [item for item in overrides if item.split("=", 1)[0] != key] + [f"{key}={value}"]


def sized_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe with the benchmark's sizes (options left at None keep the recipe's values) and free ports."""
    recipe: dict[str, Any] = yaml.safe_load(RECIPE.read_text())
    components = recipe["components"]
    setup = components["setup"]["run"]
    options = {
        "--train-tasks": args.train_tasks,
        "--eval-tasks": args.eval_tasks,
        "--seed": args.seed,
        "--episodes-per-task": args.episodes_per_task,
        "--imperfect-fraction": args.imperfect_fraction,
    }
    for flag, value in options.items():
        if value is not None:
            set_option(setup, flag, value)
    given = {word[2:].replace("-", "_"): setup[i + 1] for i, word in enumerate(setup) if word.startswith("--")}
    recipe["tasks"].update({k: int(given[k]) for k in ("train_tasks", "eval_tasks", "seed")})
    recipe["expert"].update(episodes_per_task=int(given["episodes_per_task"]),
                            imperfect_fraction=float(given["imperfect_fraction"]))  # fmt: skip
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = int(given["train_tasks"]) * int(given["episodes_per_task"])
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
            overrides = overrides if value is None else set_override(overrides, key, value)
        components[name]["set"] = overrides
    for name in ("rollout-rl", "rollout-dense"):
        if args.rl_rounds is not None:
            components[name]["rounds"] = args.rl_rounds
        if args.rl_budget is not None:
            components[name]["budget"] = args.rl_budget
    return remap_ports(recipe)


def remap_ports(recipe: dict[str, Any]) -> dict[str, Any]:
    """Give every server a free port, and rewrite the URLs and ``--port`` words that named the old one."""
    moves = {spec["port"]: free_port() for spec in recipe["components"].values() if "port" in spec}
    text = json.dumps(recipe)
    for old, new in moves.items():
        text = re.sub(rf'("port": |127\.0\.0\.1:|"--port", "){old}\b', rf"\g<1>{new}", text)
    return dict(json.loads(text))


def run(args: argparse.Namespace) -> int:
    """Run the sized recipe and print the report; the exit status of ``orchard run``."""
    run_dir = args.run_dir.resolve()
    if run_dir.exists():
        sys.exit(f"{run_dir} exists; pass another --run-dir (or `orchard run --resume {run_dir}` to continue it)")
    recipe_path = run_dir.with_name(run_dir.name + "-recipe.yaml")
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(json.dumps(sized_recipe(args), indent=1))  # JSON is YAML
    orchard = Path(sys.executable).with_name("orchard")
    command = [str(orchard), "run", str(recipe_path), "--run-dir", str(run_dir), "--duration", str(args.duration)]
    command += [] if args.live else ["--no-live"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log_path = run_dir.with_name(run_dir.name + "-run.log")
    output = "the terminal" if args.live else str(log_path)
    print(f"recipe: {recipe_path}\nrun directory: {run_dir}\nrun log: {output}\n$ {' '.join(command)}", flush=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        stdout = None if args.live else log
        code = subprocess.run(command, cwd=REPO, env=env, stdout=stdout, stderr=stdout, check=False).returncode  # noqa: S603
    report(run_dir, time.monotonic() - start)
    return code


def report(run_dir: Path, wall_s: float) -> None:
    """Print the results table, the stages' wall times, the trainers' throughput, RL figures, and the plot's path."""
    state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").is_file() else {}
    print(f"\nrun {state.get('status', '?')}: {state.get('reason', '')} ({wall_s:.0f} s in all)")
    print("\n| stage | status | wall time (s) |\n|---|---|---|")
    walls: dict[str, float] = {}
    for stage in state.get("stages", []):
        started, ended = stage.get("started_at"), stage.get("ended_at")
        if started and ended:
            walls[stage["name"]] = ended - started
        seconds = f"{walls[stage['name']]:.1f}" if stage["name"] in walls else "-"
        print(f"| {stage['name']} | {stage['status']} | {seconds} |")
    print()
    for name in TRAINERS:
        print(trainer_line(name, run_dir / name))
    rl_line(run_dir, walls)
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))
    plot = run_dir / "reward_curve.png"
    print(f"reward curve: {plot}" if plot.is_file() else "(no reward_curve.png)")


def trainer_line(name: str, directory: Path) -> str:
    """Steps, samples and tokens/s of one trainer component, from its ``metrics.jsonl``."""
    steps = metrics(directory)
    if not steps:
        return f"{name}: no metrics"
    tokens = sum(float(row["tokens"]) for row in steps)
    seconds = sum(float(row["seconds"]) for row in steps)
    rate = f"{tokens / seconds:.0f} tokens/s" if seconds else "tokens/s unknown"
    losses = f"loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}"
    return f"{name}: {len(steps)} steps, {tokens:.0f} tokens, {rate}, {losses}"


def metrics(directory: Path) -> list[dict[str, Any]]:
    """The rows of a trainer's ``metrics.jsonl`` (none when it did not run)."""
    path = directory / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def rl_line(run_dir: Path, walls: dict[str, float]) -> None:
    """Episodes/s of the RL stages (policy episodes on the bus over the stages' wall time) and the policy lag."""
    from orchard.bus import open_bus
    from orchard.codec import Codec
    from orchard.config import load_config
    from orchard.topics import OUTCOMES

    config_path = run_dir / "orchard.yaml"
    if not config_path.is_file():
        return
    bus, codec, episodes = open_bus(load_config(config_path).bus), Codec.default(), 0
    try:
        reader = bus.consumer([OUTCOMES])
        while batch := reader.poll(max_records=1000, timeout_s=0.5):
            episodes += sum(1 for r in batch if RL_GROUP.match(str(codec.decode(r.value).record.get("group_id", ""))))
        reader.close()
    finally:
        bus.close()
    seconds = sum(walls.get(stage, 0.0) for stage in RL_STAGES)
    rate = f"{episodes / seconds:.2f} episodes/s" if seconds else "episodes/s unknown"
    print(f"RL stages: {episodes} policy episodes in {seconds:.0f} s, {rate}")
    lags = sorted(float(row["policy_lag_mean"]) for name in ("trainer-rl", "trainer-dense")
                  for row in metrics(run_dir / name) if row.get("policy_lag_mean") is not None)  # fmt: skip
    if lags:
        dropped = sum(int(row.get("samples_dropped_stale", 0)) for name in ("trainer-rl", "trainer-dense")
                      for row in metrics(run_dir / name))  # fmt: skip
        quantile = {q: lags[min(len(lags) - 1, int(q * len(lags)))] for q in (0.5, 0.9)}
        print(f"policy lag (mean per RL step, versions): p50 {quantile[0.5]:.2f}, p90 {quantile[0.9]:.2f}, "
              f"max {lags[-1]:.2f}; samples dropped as stale {dropped}")  # fmt: skip


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime("learn-%Y%m%d-%H%M%S"))
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
    parser.add_argument("--duration", type=float, default=7200.0, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
