"""What the recipe benchmarks (``claw.py``, ``gui.py``, ``learn.py``, ``swe.py``) share: sizing a recipe, running it,
reading what it left.

A benchmark copies a recipe beside its run directory with its own sizes and free ports, runs it with
``orchard run``, then reports from the run directory (``state.json``, ``results.md``, the trainers' ``metrics.jsonl``,
the components' logs) and from the run's bus.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from local_servers import free_port  # a sibling: the script importing this module has put the folder on sys.path

REPO = Path(__file__).resolve().parents[1]


def embedded_component_env(work: Path, run_id: str, admin_token: str, env_token: str) -> dict[str, str]:
    """What ``orchard run`` gives its components, for a stack under ``work``: the run, an embedded bus and a local
    store there, the proxy's and the Env's tokens, quiet JSON logs, and this checkout on ``PYTHONPATH``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "ORCHARD_RUN_ID": run_id,
        "ORCHARD_BUS__TYPE": "embedded",
        "ORCHARD_BUS__PATH": str(work / "bus"),
        "ORCHARD_STORE__TYPE": "local",
        "ORCHARD_STORE__PATH": str(work / "store"),
        "ORCHARD_LOG_LEVEL": "WARNING",
        "ORCHARD_LOG_FORMAT": "json",
        "ORCHARD_PROXY_ADMIN_TOKEN": admin_token,
        "ORCHARD_ENV_TOKEN": env_token,
    }


def set_option(words: list[str], flag: str, value: object) -> None:
    """Replace the value after ``flag`` in a command line (the flag must be there)."""
    words[words.index(flag) + 1] = str(value)


def set_override(overrides: list[str], key: str, value: object) -> list[str]:
    """``overrides`` with ``key=value`` replacing any earlier override of ``key``."""
    return [item for item in overrides if item.split("=", 1)[0] != key] + [f"{key}={value}"]


def remap_ports(recipe: dict[str, Any]) -> dict[str, Any]:
    """Give every server a free port, and rewrite the URLs and ``--port`` words that named the old one."""
    moves = {spec["port"]: free_port() for spec in recipe["components"].values() if "port" in spec}
    text = json.dumps(recipe)
    for old, new in moves.items():
        text = re.sub(rf'("port": |127\.0\.0\.1:|"--port", "){old}\b', rf"\g<1>{new}", text)
    return dict(json.loads(text))


def resized(
    recipe: dict[str, Any],
    *,
    demos: int,
    rollouts: tuple[str, ...],
    rl_rounds: int | None,
    rl_budget: int | None,
    sft_steps: int | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """``recipe`` with the sizes the recipe benchmarks share, then free ports: ``demos`` episodes in the demos stage,
    the BAR rounds and budget of each of the ``rollouts`` components, the most optimizer steps of credit SFT, and the
    engine's completion length (a size left at None keeps the recipe's value)."""
    components = recipe["components"]
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = demos
    if sft_steps is not None:
        trainer = components["trainer-credit"]
        trainer["set"] = set_override(trainer["set"], "max_steps", sft_steps)
    for name in rollouts:
        if rl_rounds is not None:
            components[name]["rounds"] = rl_rounds
        if rl_budget is not None:
            components[name]["budget"] = rl_budget
    if max_tokens is not None:
        set_option(components["engine"]["args"], "--default-max-tokens", max_tokens)
    return remap_ports(recipe)


def recipe_parser(description: str, run_name: str) -> argparse.ArgumentParser:
    """A benchmark's command line, starting with ``--run-dir`` (by default ``runs/<run_name>-<date>-<time>``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / time.strftime(f"{run_name}-%Y%m%d-%H%M%S"))
    return parser


def add_run_options(parser: argparse.ArgumentParser, duration_s: float) -> None:
    """The options a benchmark's command line ends with: how long the run may take, and where its log goes."""
    parser.add_argument("--duration", type=float, default=duration_s, help="Stop the run after this many seconds.")
    parser.add_argument("--live", action="store_true", help="Show the live table (else the run's log goes to a file).")


def run_and_report(recipe: dict[str, Any], args: argparse.Namespace, report: Callable[[Path, float], None]) -> int:
    """Run the sized ``recipe`` in ``args.run_dir`` as the options say, then ``report`` on it (the run directory and
    its wall seconds); returns the exit status of ``orchard run``."""
    run_dir = args.run_dir.resolve()
    code, wall_s = run_recipe(recipe, run_dir, duration_s=args.duration, live=args.live)
    report(run_dir, wall_s)
    return code


def run_recipe(recipe: dict[str, Any], run_dir: Path, *, duration_s: float, live: bool) -> tuple[int, float]:
    """Write ``recipe`` beside ``run_dir`` and run it; returns (exit status of ``orchard run``, seconds)."""
    if run_dir.exists():
        sys.exit(f"{run_dir} exists; pass another --run-dir (or `orchard run --resume {run_dir}` to continue it)")
    recipe_path = run_dir.with_name(run_dir.name + "-recipe.yaml")
    recipe_path.parent.mkdir(parents=True, exist_ok=True)
    recipe_path.write_text(json.dumps(recipe, indent=1))  # JSON is YAML
    orchard = Path(sys.executable).with_name("orchard")
    command = [str(orchard), "run", str(recipe_path), "--run-dir", str(run_dir), "--duration", str(duration_s)]
    command += [] if live else ["--no-live"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    log_path = run_dir.with_name(run_dir.name + "-run.log")
    output = "the terminal" if live else str(log_path)
    print(f"recipe: {recipe_path}\nrun directory: {run_dir}\nrun log: {output}\n$ {' '.join(command)}", flush=True)
    start = time.monotonic()
    with open(log_path, "wb") as log:
        stdout = None if live else log
        code = subprocess.run(command, cwd=REPO, env=env, stdout=stdout, stderr=stdout, check=False).returncode  # noqa: S603
    return code, time.monotonic() - start


def stage_walls(run_dir: Path, wall_s: float) -> dict[str, float]:
    """Print the run's status and each stage's wall time; returns the wall times by stage."""
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
    return walls


def stage_and_trainer_lines(run_dir: Path, wall_s: float, trainers: Iterable[str]) -> dict[str, float]:
    """Print the run's status, each stage's wall time and each trainer's throughput; returns the wall times by stage."""
    walls = stage_walls(run_dir, wall_s)
    for name in trainers:
        print(trainer_line(name, run_dir / name))
    return walls


def results_table(run_dir: Path) -> None:
    """Print the run's results table (``results.md``), or say that no evaluation stage finished."""
    results = run_dir / "results.md"
    print("\n" + (results.read_text() if results.is_file() else "(no results.md: no evaluation stage finished)"))


def reward_curve_line(run_dir: Path) -> None:
    """Print where the run's reward curve is, or that it has none."""
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


def policy_lag_line(run_dir: Path, trainers: tuple[str, ...]) -> None:
    """Print the distribution of the RL trainers' mean policy lag per step, and the samples dropped as stale."""
    lags = sorted(float(row["policy_lag_mean"]) for name in trainers
                  for row in metrics(run_dir / name) if row.get("policy_lag_mean") is not None)  # fmt: skip
    if lags:
        dropped = sum(int(row.get("samples_dropped_stale", 0)) for name in trainers
                      for row in metrics(run_dir / name))  # fmt: skip
        quantile = {q: lags[min(len(lags) - 1, int(q * len(lags)))] for q in (0.5, 0.9)}
        print(f"policy lag (mean per RL step, versions): p50 {quantile[0.5]:.2f}, p90 {quantile[0.9]:.2f}, "
              f"max {lags[-1]:.2f}; samples dropped as stale {dropped}")  # fmt: skip


def stage_kind(group_id: str, rl: str) -> str:
    """Which kind of stage an episode's group belongs to: ``demos``, ``evaluations``, or ``rl`` (the policy's own
    train episodes)."""
    if group_id.startswith("demo-"):
        return "demos"
    if group_id.startswith("eval-"):
        return "evaluations"
    return rl


def walls_by_kind(walls: dict[str, float], rl: str, rl_stages: tuple[str, ...]) -> dict[str, float]:
    """Wall seconds per kind of stage: the demos stage, the ``rl_stages`` together (as ``rl``), every evaluation
    together."""
    return {
        "demos": walls.get("demos", 0.0),
        rl: sum(walls.get(stage, 0.0) for stage in rl_stages),
        "evaluations": sum(wall for name, wall in walls.items() if name.startswith("eval-")),
    }


def epoch_seconds(value: Any) -> float | None:
    """Epoch seconds of a decoded timestamp (a datetime, or epoch milliseconds)."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float):
        return float(value) / 1000
    return None


def outcome_span(outcome: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) of an episode in epoch seconds, from its outcome (None when either is missing)."""
    start, end = epoch_seconds(outcome.get("started_at")), epoch_seconds(outcome.get("ended_at"))
    return None if start is None or end is None else (start, end)


def episode_table(
    durations: dict[str, list[float]], walls: dict[str, float], successes: dict[str, int] | None = None
) -> None:
    """Print, per kind of stage, its episodes (and those that succeeded, where ``successes`` is given), its wall
    time, episodes/hour over that time, and the mean episode duration."""
    counted = successes is not None
    columns = ["episodes of", "episodes", *(["succeeded"] if counted else []), "stage wall time (s)", "episodes/hour",
               "mean episode (s)"]  # fmt: skip
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for kind, wall in walls.items():
        runs = durations.get(kind, [])
        rate = f"{len(runs) / wall * 3600:.0f}" if wall and runs else "-"
        mean = f"{statistics.fmean(runs):.1f}" if runs else "-"
        succeeded = [str(successes.get(kind, 0))] if successes is not None else []
        print("| " + " | ".join([kind, str(len(runs)), *succeeded, f"{wall:.0f}", rate, mean]) + " |")


def sandbox_setup_lines(run_dir: Path, envs: dict[str, str]) -> None:
    """Print the sandbox set-up time of each Env component (its ``sandbox_created`` log lines), with the kind of
    stage it serves: ``envs`` maps component to kind."""
    for component, kind in envs.items():
        setups = sorted(float(e["ms"]) / 1000 for e in log_events(run_dir, component, "sandbox_created") if "ms" in e)
        if setups:
            mean, p50 = statistics.fmean(setups), setups[len(setups) // 2]
            print(f"sandbox set-up ({kind}, {component}): {len(setups)} sandboxes, mean {mean:.2f} s, "
                  f"p50 {p50:.2f} s, max {setups[-1]:.2f} s")  # fmt: skip


def run_records(run_dir: Path, topic: str) -> Iterator[dict[str, Any]]:
    """Every decodable record on ``topic`` of the bus the run's ``orchard.yaml`` names."""
    from orchard.bus import open_bus, read_until_quiet
    from orchard.codec import Codec
    from orchard.config import load_config

    config_path = run_dir / "orchard.yaml"
    if not config_path.is_file():
        return
    bus, codec = open_bus(load_config(config_path).bus), Codec.default()
    try:
        reader = bus.consumer([topic])
        for record in read_until_quiet(reader, max_records=1000, poll_timeout_s=0.5, idle_polls=1):
            yield codec.decode(record.value).record
        reader.close()
    finally:
        bus.close()


def log_events(run_dir: Path, component_prefix: str, event: str) -> Iterator[dict[str, Any]]:
    """The JSON log lines named ``event`` in the logs of the components whose name starts with the prefix."""
    for path in sorted((run_dir / "logs").glob(f"{component_prefix}*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"{event}"' in line:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if entry.get("event") == event:
                    yield entry
