"""``orchard run`` with real components (scripted engine, recording proxy, assembler) on the run's embedded bus:
it starts them in order, restarts one killed with SIGKILL, stops everything on SIGINT and resumes in place."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig
from orchard.topics import STANDARD_TOPICS

ORCHARD = Path(sys.executable).with_name("orchard")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_recipe(tmp_path: Path) -> tuple[Path, int]:
    (tmp_path / "plan.yaml").write_text("steps:\n  - text: hello\n")
    engine_port, proxy_port = free_port(), free_port()
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "components:\n"
        f"  engine: {{kind: scripted-engine, plan: plan.yaml, port: {engine_port}}}\n"
        f"  proxy: {{kind: proxy, backend: engine, port: {proxy_port}, stop_grace_s: 5}}\n"
        "  assembler: {kind: consumer, name: assembler, after: [proxy]}\n"
        "restart: {max_restarts: 3, backoff_s: 0.2}\n"
        "stages: [{name: sft, components: [assembler]}]\n"
    )
    return recipe, proxy_port


def start_run(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ORCHARD_LOG_FORMAT": "json", "PYTHONPATH": str(REPO)}
    for name in [k for k in env if k.startswith(("ORCHARD_BUS__", "ORCHARD_STORE__"))] + ["ORCHARD_CONFIG"]:
        env.pop(name, None)  # the run's own bus and store, whatever the calling shell says
    return subprocess.Popen([str(ORCHARD), "run", *args, "--no-live"], env=env, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)  # fmt: skip


def wait_for(predicate: Callable[[dict[str, Any]], bool], run_dir: Path, process: subprocess.Popen[bytes]) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"orchard run exited early with {process.returncode}"
        try:
            state = json.loads((run_dir / "state.json").read_text())
        except (FileNotFoundError, ValueError):
            state = {}
        if state and predicate(state):
            return state
        time.sleep(0.1)
    raise AssertionError(f"timed out; last state {state}")


def all_healthy(state: dict[str, Any]) -> bool:
    return all(c["status"] == "healthy" for c in state["components"].values())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_with_sigint(process: subprocess.Popen[bytes], run_dir: Path, pids: set[int]) -> dict[str, Any]:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=40) == 130  # 128 + SIGINT, as a shell reports Ctrl-C
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "stopped"
    assert {name: c["status"] for name, c in state["components"].items()} == dict.fromkeys(
        ("engine", "proxy", "assembler"), "stopped"
    )
    assert sorted(pid for pid in pids if alive(pid)) == []
    return state


def test_run_supervises_restarts_stops_and_resumes(tmp_path: Path) -> None:
    recipe, proxy_port = write_recipe(tmp_path)
    run_dir, log = tmp_path / "run", tmp_path / "orchard-run.log"
    process = start_run([str(recipe), "--run-dir", str(run_dir)], log)
    try:
        state = wait_for(all_healthy, run_dir, process)
        assert httpx.get(f"http://127.0.0.1:{proxy_port}/healthz").status_code == 200
        pids = {c["pid"] for c in state["components"].values()}
        killed = state["components"]["assembler"]["pid"]
        os.kill(killed, signal.SIGKILL)
        state = wait_for(lambda s: s["components"]["assembler"]["restarts"] == 1 and all_healthy(s), run_dir, process)
        assert state["components"]["assembler"]["pid"] != killed
        pids |= {c["pid"] for c in state["components"].values()}
        state = stop_with_sigint(process, run_dir, pids)
        assert state["starts"] == 1
        stages = [(s["name"], s["components"], s["status"]) for s in state["stages"]]
        assert stages == [("sft", ["assembler"], "running")]

        process = start_run(["--resume", str(run_dir)], log)
        state = wait_for(lambda s: s["starts"] == 2 and all_healthy(s), run_dir, process)
        assert {c["restarts"] for c in state["components"].values()} == {0}
        stop_with_sigint(process, run_dir, {c["pid"] for c in state["components"].values()})
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = (run_dir / "logs" / "assembler.log").read_text().splitlines()
    starts = [json.loads(line)["run_start"] for line in lines if "orchard run: starting component" in line]
    assert starts == [1, 1, 2]  # first start, its restart after SIGKILL, the resumed start: one log, appended
    bus = open_bus(EmbeddedBusConfig(path=run_dir / "bus"))  # the run's own bus, holding the standard topics
    try:
        topics, standard = set(bus.list_topics()), {spec.name for spec in STANDARD_TOPICS}
        # and the assembler's changelog once it got to create it (a slow start can be stopped before that)
        assert standard <= topics <= standard | {"assembler.changelog"}
    finally:
        bus.close()


def run_to_end(recipe: Path, run_dir: Path, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_")} | {"PYTHONPATH": str(REPO)}
    return subprocess.run([str(ORCHARD), "run", str(recipe), "--run-dir", str(run_dir), "--plain"], env=env,
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip


def test_a_typo_in_a_later_components_settings_is_refused_before_anything_starts(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "components:\n"
        '  first: {kind: command, run: [python, -c, \'open("started", "w")\']}\n'
        "  trainer: {kind: policy-trainer, set: [learning_rate=1e-3, 'run_dir={run_dir}/t']}\n"
        "  builder: {kind: consumer, name: sample-builder,\n"
        "            env: {ORCHARD_CONSUMERS__SAMPLE_BUILDER__KINDS: '[\"PPO\"]'}}\n"
        "stages: [{name: one, components: [first]}, {name: two, components: [trainer, builder]}]\n"
    )
    result = run_to_end(recipe, tmp_path / "run", timeout_s=60)

    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said
    assert "component 'trainer': set:" in said and "learning_rate: Extra inputs are not permitted" in said
    assert "component 'builder': env:" in said and "consumers.sample_builder.kinds" in said
    assert not (tmp_path / "started").exists() and not (tmp_path / "run" / "state.json").exists()


def test_a_port_taken_by_a_stranger_fails_the_component_instead_of_adopting_the_stranger(tmp_path: Path) -> None:
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    (tmp_path / "plan.yaml").write_text("steps:\n  - text: hello\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"components:\n  engine: {{kind: scripted-engine, plan: plan.yaml, port: {port}}}\n")
    try:
        result = run_to_end(recipe, tmp_path / "run")
    finally:
        stranger.close()

    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said
    assert f"engine (port {port} is already in use by a process this run did not start)" in said
    assert json.loads((tmp_path / "run" / "state.json").read_text())["components"]["engine"]["pid"] is None


def test_a_usage_error_is_not_retried_and_its_last_lines_are_on_the_screen(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    script = "import sys; print('error: no such option: --frobnicate', file=sys.stderr); sys.exit(2)"
    recipe.write_text(
        f"components:\n  step: {{kind: command, run: [python, -c, {json.dumps(script)}]}}\n"
        "restart: {policy: on-failure, max_restarts: 3, backoff_s: 0.2}\n"
    )
    result = run_to_end(recipe, tmp_path / "run")

    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 1, said
    assert "step (usage error (exit code 2), not restarted)" in said
    assert "last lines of" in said and "error: no such option: --frobnicate" in said
    assert json.loads((tmp_path / "run" / "state.json").read_text())["components"]["step"]["restarts"] == 0
