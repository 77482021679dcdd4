"""What the recipe tests share: a shipped recipe shrunk to a test's size, run to its end with ``orchard run``, and read
back from the run's bus.

A recipe test moves the recipe's fixed ports to free ones, turns its sizes down, runs it in a temporary directory and
asserts on the run directory and on the records of the run on its bus.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

from orchard.bus import open_bus
from orchard.config import load_config
from tests.integration.test_run_pipeline import ORCHARD, REPO, orchard_env, read_run, run_logs


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def set_flag(words: list[str], flag: str, value: str) -> None:
    """Replace the value after ``flag`` in a command line (the flag must be there)."""
    words[words.index(flag) + 1] = value


def set_override(overrides: list[str], key: str, value: str) -> None:
    """Replace ``key=...`` in a trainer's ``set`` list (the key must be there)."""
    index = next(i for i, item in enumerate(overrides) if item.startswith(f"{key}="))
    overrides[index] = f"{key}={value}"


def with_free_ports(recipe: dict[str, Any], port: re.Pattern[str]) -> dict[str, Any]:
    """A copy of ``recipe`` with every port that ``port`` matches moved to a free one (the same port to the same)."""
    ports: dict[str, str] = {}
    text = port.sub(lambda m: ports.setdefault(m.group(0), str(free_port())), json.dumps(recipe))
    moved: dict[str, Any] = json.loads(text)
    return moved


def train_on_pairs(builder_env: dict[str, str]) -> None:
    """Have an RL sample builder group episodes in twos, and wait for a group only 20 s."""
    builder_env["ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE"] = "2"
    builder_env["ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_TIMEOUT_MS"] = "20000"
    # the barely trained policy fails alike in a group (zero advantage): train on such samples all the same, so the
    # RL trainers step and publish
    builder_env["ORCHARD_CONSUMERS__SAMPLE_BUILDER__EMIT_ZERO_SAMPLES"] = "true"


def limit_stages(recipe: dict[str, Any], demos: int, timeout_s: int) -> None:
    """End the demos stage after ``demos`` episodes, and give every stage ``timeout_s``."""
    for stage in recipe["stages"]:
        if stage["name"] == "demos":
            stage["until"]["count"] = demos
        stage["timeout_s"] = timeout_s


def run_to_completion(
    recipe: Path, run_dir: Path, *, duration_s: int, grace_s: int = 60, cwd: Path = REPO
) -> dict[str, Any]:
    """Run ``recipe`` into ``run_dir`` for at most ``duration_s`` (the process is killed ``grace_s`` later); assert
    that ``orchard run`` exited 0 with the run completed, and return the run's ``state.json``."""
    result = subprocess.run(  # noqa: S603 - fixed command
        [str(ORCHARD), "run", str(recipe), "--run-dir", str(run_dir), "--no-live", "--duration", str(duration_s)],
        env=orchard_env(), cwd=cwd, capture_output=True, timeout=duration_s + grace_s, check=False,
    )  # fmt: skip
    state: dict[str, Any] = json.loads((run_dir / "state.json").read_text())
    assert result.returncode == 0, (result.stderr.decode()[-3000:], state, run_logs(run_dir))
    assert state["status"] == "completed", state["reason"]
    return state


def run_records(run_dir: Path, topic: str, run_id: str) -> list[dict[str, Any]]:
    """Run ``run_id``'s records on ``topic`` of the bus the run's ``orchard.yaml`` names."""
    bus = open_bus(load_config(run_dir / "orchard.yaml").bus)
    try:
        return [record for _, record in read_run(bus, topic, run_id)]
    finally:
        bus.close()
