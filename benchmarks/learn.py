"""The file-lookup recipe end to end through ``orchard run``: held-out results per stage and the wall time of each.

Runs ``recipes/file_lookup/recipe.yaml`` at a chosen size (its options rewritten into a copy of the recipe beside
the run directory; the servers get free ports), then prints the run's results table (``RUN_DIR/results.md``: held-out
success with a Wilson 95% interval and mean reward per evaluated stage), the wall time of every stage, the trainers'
tokens/s, and where ``RUN_DIR/reward_curve.png`` is. Not part of CI: the full recipe takes a long time on CPU.

    python benchmarks/learn.py [--run-dir runs/learn] [--train-tasks 1000] [--eval-tasks 256] [--steps 300]
                               [--episodes-per-task 1] [--imperfect-fraction 0.3] [--lr 1e-3] [--batch-tokens 4096]
                               [--cpu-threads 2] [--seed 0] [--duration 7200] [--live]

``--steps`` caps each SFT stage's optimizer steps (each stage is at most one pass over its samples). The exit status
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
TRAINERS = {"trainer": 1, "trainer-credit": 2}  # component -> how many SFT stages its max_steps spans


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
    """The recipe with the benchmark's sizes and free ports."""
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
        set_option(setup, flag, value)
    recipe["tasks"].update(train_tasks=args.train_tasks, eval_tasks=args.eval_tasks, seed=args.seed)
    recipe["expert"].update(episodes_per_task=args.episodes_per_task, imperfect_fraction=args.imperfect_fraction)
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = args.train_tasks * args.episodes_per_task
    for name, stages in TRAINERS.items():
        overrides = components[name]["set"]
        sizes = {
            "max_steps": args.steps * stages,
            "publish_every": max(1, min(50, args.steps)),
            "lr": args.lr,
            "batch_tokens": args.batch_tokens,
            "cpu_threads": args.cpu_threads,
        }
        for key, value in sizes.items():
            overrides = set_override(overrides, key, value)
        components[name]["set"] = overrides
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
    """Print the results table, the stages' wall times, the trainers' throughput, and the plot's path."""
    state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").is_file() else {}
    print(f"\nrun {state.get('status', '?')}: {state.get('reason', '')} ({wall_s:.0f} s in all)")
    print("\n| stage | status | wall time (s) |\n|---|---|---|")
    for stage in state.get("stages", []):
        started, ended = stage.get("started_at"), stage.get("ended_at")
        seconds = f"{ended - started:.1f}" if started and ended else "-"
        print(f"| {stage['name']} | {stage['status']} | {seconds} |")
    for name in TRAINERS:
        print(trainer_line(name, run_dir / name))
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))
    plot = run_dir / "reward_curve.png"
    print(f"reward curve: {plot}" if plot.is_file() else "(no reward_curve.png)")


def trainer_line(name: str, directory: Path) -> str:
    """Steps, samples and tokens/s of one trainer component, from its ``metrics.jsonl``."""
    path = directory / "metrics.jsonl"
    if not path.is_file():
        return f"{name}: no metrics"
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tokens = sum(float(row["tokens"]) for row in steps)
    seconds = sum(float(row["seconds"]) for row in steps)
    rate = f"{tokens / seconds:.0f} tokens/s" if seconds else "tokens/s unknown"
    losses = f", loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}" if steps else ""
    return f"{name}: {len(steps)} steps, {tokens:.0f} tokens, {rate}{losses}"


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime("learn-%Y%m%d-%H%M%S"))
    parser.add_argument("--train-tasks", type=int, default=1000)
    parser.add_argument("--eval-tasks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300, help="Most optimizer steps of each SFT stage.")
    parser.add_argument("--episodes-per-task", type=int, default=1, help="Expert demonstrations per train task.")
    parser.add_argument("--imperfect-fraction", type=float, default=0.3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-tokens", type=int, default=4096, help="Tokens per optimizer step.")
    parser.add_argument("--cpu-threads", type=int, default=2, help="torch threads of each trainer.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the task splits.")
    parser.add_argument("--duration", type=float, default=7200.0, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
