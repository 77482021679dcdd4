"""What the recipe benchmarks (``learn.py``, ``swe.py``) share: sizing a recipe, running it, reading what it left.

A benchmark copies a recipe beside its run directory with its own sizes and free ports, runs it with
``orchard run``, then reports from the run directory (``state.json``, ``results.md``, the trainers' ``metrics.jsonl``,
the components' logs) and from the run's bus.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def remap_ports(recipe: dict[str, Any]) -> dict[str, Any]:
    """Give every server a free port, and rewrite the URLs and ``--port`` words that named the old one."""
    moves = {spec["port"]: free_port() for spec in recipe["components"].values() if "port" in spec}
    text = json.dumps(recipe)
    for old, new in moves.items():
        text = re.sub(rf'("port": |127\.0\.0\.1:|"--port", "){old}\b', rf"\g<1>{new}", text)
    return dict(json.loads(text))


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
