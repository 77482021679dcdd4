"""An evaluation stage of the file-lookup recipe: wait until the engine serves the run's newest policy, then evaluate.

``python -m recipes.file_lookup.evaluate --engine URL --run-dir RUN_DIR [--wait-timeout 600] -- orchard eval ...``

A training stage ends when its trainer has published; the engine started with ``--reload`` picks the new weights up
a moment later. Evaluating in between would measure the previous policy under the new stage's name, so this waits
until the engine's ``/healthz`` reports a ``policy_version`` at least the newest ``PolicyVersion`` of the run on
the bus (read through ``RUN_DIR/orchard.yaml``, which ``orchard run`` writes), then runs the command after ``--``
(a first word ``orchard`` is this environment's) and exits with its status. It exits 1 if the engine does not get
there within ``--wait-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from orchard.config import load_config
from orchard.logging import get_logger
from orchard.run.commands import orchard_executable
from orchard.run.stages import BusProbe

log = get_logger("recipes.file_lookup.evaluate")
POLL_S = 0.5


def served_version(engine: str, client: httpx.Client) -> int | None:
    """The policy version the engine at ``engine`` reports serving (None while it does not answer)."""
    try:
        response = client.get(f"{engine.rstrip('/')}/healthz")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    version = response.json().get("policy_version")
    return int(version) if version is not None else None


def wait_for_newest(engine: str, run_dir: Path, timeout_s: float) -> int | None:
    """Wait until ``engine`` serves the newest policy version of the run; return it (None: timed out)."""
    config = load_config(run_dir / "orchard.yaml")
    probe = BusProbe(config.bus, config.run_id)
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                newest = probe.policy_version() or 0
                serving = served_version(engine, client)
                if serving is not None and serving >= newest:
                    log.info("engine serves the newest policy", policy_version=serving, newest=newest)
                    return serving
                time.sleep(POLL_S)
    finally:
        probe.close()
    log.error("engine did not serve the newest policy in time", engine=engine, timeout_s=timeout_s)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.file_lookup.evaluate --engine URL --run-dir RUN_DIR -- COMMAND...``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.file_lookup.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", required=True, help="Base URL of the reloading engine (without /v1).")
    parser.add_argument("--run-dir", type=Path, required=True, help="The run directory (its orchard.yaml).")
    parser.add_argument("--wait-timeout", type=float, default=600.0, help="Longest wait for the engine, seconds.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the evaluation command.")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the evaluation command after --")
    if wait_for_newest(args.engine, args.run_dir, args.wait_timeout) is None:
        return 1
    head = orchard_executable() if command[0] == "orchard" else [command[0]]
    return subprocess.run([*head, *command[1:]], check=False).returncode  # noqa: S603 - the recipe's own command


if __name__ == "__main__":
    sys.exit(main())
