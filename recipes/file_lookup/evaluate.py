"""Compatibility entry point: wait until the engine serves the run's newest policy, then run an evaluation command.

``python -m recipes.file_lookup.evaluate --engine URL --run-dir RUN_DIR [--wait-timeout 600] -- orchard eval ...``

The wait is Orchard's (``orchard.evaluation.engine_wait``); the recipes now spell it ``orchard eval --wait-for-engine
URL [--wait-timeout 600] --tasks ...``. This keeps the older command working: it waits until the engine's
``/healthz`` reports a ``policy_version`` at least the newest ``PolicyVersion`` of the run on the bus (read through
``RUN_DIR/orchard.yaml``, which ``orchard run`` writes), then runs the command after ``--`` (a first word
``orchard`` is this environment's) and exits with its status. It exits 1 if the engine does not get there within
``--wait-timeout`` seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from orchard.config import load_config
from orchard.run.commands import orchard_executable
from orchard.run.stages import wait_for_newest_policy


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
    config = load_config(args.run_dir / "orchard.yaml")
    if wait_for_newest_policy(args.engine, config.bus, config.run_id, args.wait_timeout) is None:
        return 1
    head = orchard_executable() if command[0] == "orchard" else [command[0]]
    return subprocess.run([*head, *command[1:]], check=False).returncode  # noqa: S603 - the recipe's own command


if __name__ == "__main__":
    sys.exit(main())
