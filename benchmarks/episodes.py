"""What one file-lookup demonstration episode costs, phase by phase, beside a floor with no Orchard in between.

Runs N scripted-expert demonstrations of the file-lookup recipe exactly as its ``demos`` stage does: the expert
backend (``python -m recipes.file_lookup.expert serve``), the recording proxy (``orchard proxy serve``) and the Env
(``orchard env serve``, the local sandbox runtime) each in its own process on an embedded bus, the episodes submitted
to the Env's REST API as ``orchard rollout run --demos`` does, and their outcomes read back from the bus. Then it
prints the cost per episode split by phase, from the Env's episode events (``GET /episodes/{id}/events``, each with
its time) and the proxy's ``ModelCall`` records (arrival time and latency of every model call):

==================  ====================================================================================
sandbox create      ``started`` to ``sandbox-created`` (``Runtime.create``)
proxy open          to ``sandbox-ready`` (the proxy's per-episode token, one REST call)
harness prepare     to ``harness-prepared`` (the adapter writes its files into the sandbox)
harness start       to the first model call's arrival at the proxy (sandbox exec, interpreter, imports)
model calls         the proxy's latency of every call, summed (proxy, expert backend, recording)
tools + agent loop  from each answer to the next call's arrival (the shell commands, the agent's own work)
harness exit        from the last answer to ``harness-ran`` (the agent's exit, the sandbox exec's return)
collect             to ``harness-exited`` (the adapter reads the trajectory and the working copy's changes)
proxy close         to ``proxy-closed`` (every call acknowledged by the bus)
grading             to ``graded`` (the grader, ``python3 -I grade.py``, in the sandbox)
outcome publish     to ``published`` (the outcome on the bus)
delete              to ``ended`` (the sandbox deleted, the slot freed)
==================  ====================================================================================

The floor runs the same shell commands of each episode's plan, then the same grader command, from a plain Python
script (``subprocess`` with ``/bin/sh -c`` in a copy of the workspace; no sandbox, no proxy, no model), at the same
concurrency; its rows are the copy of the workspace and grader files (beside ``sandbox create``), the commands
(beside ``tools + agent loop``) and the grader (beside ``grading``).

Beside the phases: episodes per second at the Env's concurrency (first submission to last outcome), the floor's
episodes per second, and the CPU per episode of each process (from ``/proc``; the Env's own, without its sandboxes)
and of the sandboxes (harness, tools, grader: the ``orchard/`` cgroup's ``cpuacct``, so any other local sandbox
running meanwhile counts too). The load average is printed too: on a busy machine compare ratios, not absolute
figures.

    python benchmarks/episodes.py [--episodes 200] [--concurrency 4] [--work-dir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orchard.bus import open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.scripted import ScriptedPlan
from orchard.env.tasks import TaskCatalog, TaskSpec
from orchard.episode_requests import EpisodeRequest
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.rollout.scheduler import EnvSubmitter
from recipes.file_lookup.expert import Expert, ExpertConfig, write_demonstrations
from recipes.file_lookup.generate import LookupConfig, generate

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_servers import free_port, stop_in_order, wait_healthy  # noqa: E402
from recipe_runs import embedded_component_env  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "bench-episodes"
MODEL = "file-lookup-expert"
PHASES = (  # (label, event the phase ends with); the model phases come from the proxy's records
    ("sandbox create", "sandbox-created"),
    ("proxy open", "sandbox-ready"),
    ("harness prepare", "harness-prepared"),
    ("harness start", None),
    ("model calls", None),
    ("tools + agent loop", None),
    ("harness exit", "harness-ran"),
    ("collect", "harness-exited"),
    ("proxy close", "proxy-closed"),
    ("grading", "graded"),
    ("outcome publish", "published"),
    ("delete", "ended"),
)
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The ``PATH`` inside a local sandbox: the floor finds ``python3`` where the grader does."""
FLOOR_PHASES = {"tools + agent loop": "tools", "grading": "grading", "sandbox create": "copy"}


# ---------------------------------------------------------------------------------------------------- set-up
@dataclass
class Stack:
    """The servers of one run and what they need."""

    work: Path
    tasks: Path
    demos: Path
    env_url: str = ""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


def prepare(work: Path, episodes: int) -> Stack:
    """Tasks and expert plans as the recipe's setup stage writes them (3 files, 1 key each, 30% imperfect)."""
    tasks, demos = work / "tasks", work / "demos"
    generate(LookupConfig(train_tasks=episodes, eval_tasks=1, keys_per_file=1), tasks, overwrite=True)
    write_demonstrations(tasks / "train", demos, Expert(ExpertConfig(seed=0, imperfect_fraction=0.3)))
    bus = open_bus(EmbeddedBusConfig(path=work / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    bus.close()
    return Stack(work, tasks / "train", demos)


def component_env(stack: Stack, admin: str) -> dict[str, str]:
    """What ``orchard run`` gives its components (``recipe_runs.embedded_component_env``)."""
    return embedded_component_env(stack.work, RUN_ID, admin, stack.token)


def start(stack: Stack, concurrency: int) -> None:
    """The expert backend, the proxy and the Env, each in its own process; returns once all three answer."""
    admin = secrets.token_urlsafe(16)
    env = component_env(stack, admin)
    orchard = str(Path(sys.executable).with_name("orchard"))
    ports = {name: free_port() for name in ("expert", "proxy", "env")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    commands = {
        "expert": [sys.executable, "-m", "recipes.file_lookup.expert", "serve", str(stack.demos),
                   "--port", str(ports["expert"]), "--tokenizer", "tiny"],
        "proxy": [orchard, "proxy", "serve", "--backend", f"{urls['expert']}/v1", "--port", str(ports["proxy"])],
        "env": [orchard, "env", "serve", "--tasks", str(stack.tasks), "--proxy", urls["proxy"],
                "--port", str(ports["env"]), "--concurrency", str(concurrency), "--timeout", "300",
                "--sandboxes", str(stack.work / "sandboxes")],
    }  # fmt: skip
    health = {"expert": "/v1/models", "proxy": "/healthz", "env": "/healthz"}
    for name, command in commands.items():
        log = (stack.work / f"{name}.log").open("wb")
        stack.processes[name] = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)  # noqa: S603
        try:
            wait_healthy(urls[name] + health[name], stack.processes[name], timeout_s=120, interval_s=0.1,
                         log=stack.work / f"{name}.log")  # fmt: skip
        except RuntimeError as exc:  # a script: the component's log and a non-zero exit, no traceback
            sys.exit(str(exc))
    stack.env_url = urls["env"]


def stop(stack: Stack) -> None:
    """Stop the servers (the Env first, so it deletes its sandboxes)."""
    stop_in_order(stack.processes, ("env", "proxy", "expert"))


# ---------------------------------------------------------------------------------------------------- running
def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (``/proc/stat``: every state but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def background_cpu(seconds: float = 3.0) -> float:
    """Busy CPU seconds per second of the machine while this benchmark does nothing (others' load)."""
    before = machine_cpu_seconds()
    time.sleep(seconds)
    return (machine_cpu_seconds() - before) / seconds


def sandbox_cpu_seconds() -> float:
    """CPU seconds used so far by every local sandbox on the machine (cgroup v1 ``cpuacct`` of ``orchard/``; 0 where
    there is none): a sandboxed process is not its parent's child, so the Env's own figure leaves it out."""
    try:
        return int(Path("/sys/fs/cgroup/cpuacct/orchard/cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system seconds of a process and of its children it has waited for (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def demonstrations(demos: Path) -> list[tuple[str, str]]:
    """``(episode id, task id)`` of every planned demonstration."""
    lines = (demos / "demonstrations.jsonl").read_text().splitlines()
    return [(entry["episode_id"], entry["task_id"]) for entry in map(json.loads, lines)]


def run_episodes(stack: Stack, pairs: list[tuple[str, str]]) -> tuple[float, dict[str, float]]:
    """Submit every demonstration, wait for all outcomes on the bus; (seconds, CPU seconds per process)."""
    bus = open_bus(EmbeddedBusConfig(path=stack.work / "bus"))
    consumer = bus.consumer([OUTCOMES], group=None, start="earliest")
    submit = EnvSubmitter(stack.env_url, stack.token)
    codec, seen = Codec.default(), set()
    pids = {name: process.pid for name, process in stack.processes.items()}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    before |= {"client": time.process_time(), "sandboxes": sandbox_cpu_seconds(), "machine": machine_cpu_seconds()}
    started = time.perf_counter()
    for episode_id, task_id in pairs:
        submit(EpisodeRequest(task_id=task_id, group_id=f"demo-{task_id}", episode_id=episode_id,
                              harness="builtin", model=MODEL))  # fmt: skip
    deadline = time.monotonic() + 60 + 10 * len(pairs)
    while len(seen) < len(pairs) and time.monotonic() < deadline:
        for record in consumer.poll(timeout_s=0.2):
            seen.add(codec.decode(record.value).record["episode_id"])
    wall = time.perf_counter() - started
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    after |= {"client": time.process_time(), "sandboxes": sandbox_cpu_seconds(), "machine": machine_cpu_seconds()}
    submit.close()
    consumer.close()
    bus.close()
    if len(seen) < len(pairs):
        sys.exit(f"only {len(seen)} of {len(pairs)} outcomes arrived; see the logs in {stack.work}")
    return wall, {name: after[name] - before[name] for name in before}


def episode_events(stack: Stack, episode_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every event of every episode (the Env's NDJSON event stream ends once an episode has)."""
    headers = {"Authorization": f"Bearer {stack.token}"}
    out = {}
    with httpx.Client(base_url=stack.env_url, headers=headers, timeout=30) as client:
        for episode_id in episode_ids:
            text = client.get(f"/episodes/{episode_id}/events").text
            out[episode_id] = [json.loads(line) for line in text.splitlines() if line.strip()]
    return out


def model_calls(bus_path: Path) -> dict[str, list[tuple[float, float]]]:
    """Per episode, ``(arrival in s, latency in s)`` of each model call, in call order, from the proxy's records."""
    bus = open_bus(EmbeddedBusConfig(path=bus_path))
    consumer = bus.consumer([MODEL_CALLS], group=None, start="earliest")
    codec, calls = Codec.default(), {}
    for record in read_until_quiet(consumer, max_records=500, poll_timeout_s=0.5, idle_polls=1):
        call = codec.decode(record.value).record
        calls.setdefault(call["episode_id"], []).append((call["call_index"], call["timestamp"], call["latency_ms"]))
    consumer.close()
    bus.close()
    return {
        episode: [(_epoch_s(ts), latency / 1000) for _, ts, latency in sorted(items)]
        for episode, items in calls.items()
    }


def _epoch_s(timestamp: Any) -> float:
    """A ``timestamp-millis`` as fastavro decodes it (an aware datetime) or as an int, in seconds."""
    return timestamp.timestamp() if hasattr(timestamp, "timestamp") else float(timestamp) / 1000


def phase_costs(events: list[dict[str, Any]], calls: list[tuple[float, float]]) -> dict[str, float]:
    """Seconds of each phase of one episode (``PHASES``)."""
    at = {event["kind"]: float(event.get("at", event["time"])) for event in events}
    costs, previous = {}, at["started"]
    for label, kind in PHASES[:3]:
        costs[label], previous = at[kind] - previous, at[kind]
    first_arrival, last_answer = calls[0][0], calls[-1][0] + calls[-1][1]
    costs["harness start"] = first_arrival - previous
    costs["model calls"] = sum(latency for _, latency in calls)
    costs["tools + agent loop"] = sum(calls[i + 1][0] - (calls[i][0] + calls[i][1]) for i in range(len(calls) - 1))
    previous = last_answer
    for label, kind in PHASES[6:]:
        costs[label], previous = at[kind] - previous, at[kind]
    costs["queue wait"] = at["started"] - at["queued"]
    costs["episode (started to ended)"] = at["ended"] - at["started"]
    return costs


# ---------------------------------------------------------------------------------------------------- floor
def plan_commands(demos: Path, episode_id: str) -> list[str]:
    """The shell commands of an episode's plan, in order."""
    plan = ScriptedPlan.from_file(demos / "plans" / f"{episode_id}.yaml")
    return [str(c.arguments["command"]) for s in plan.steps for c in s.tool_calls if isinstance(c.arguments, dict)
            and "command" in c.arguments]  # fmt: skip


def floor_episode(task: TaskSpec, commands: list[str], scratch: Path) -> dict[str, float]:
    """The episode's shell commands and its grader from a plain script; seconds of each part."""
    costs, started = {}, time.perf_counter()
    workdir, grader, out = scratch / "work", scratch / "grader", scratch / "out"
    shutil.copytree(task.workspace, workdir)
    shutil.copytree(task.hidden, grader)
    out.mkdir()
    costs["copy"], mark = _lap(started)
    for command in commands:
        subprocess.run(["/bin/sh", "-c", command], cwd=workdir, capture_output=True, check=False)  # noqa: S603
    costs["tools"], mark = _lap(mark)
    env = {"PATH": SANDBOX_PATH, "ORCHARD_GRADER_DIR": str(grader), "ORCHARD_GRADER_OUT": str(out)}
    subprocess.run(["/bin/sh", "-c", task.grade_command], cwd=workdir, env=env, capture_output=True, check=False)  # noqa: S603
    costs["grading"], _ = _lap(mark)
    costs["episode (started to ended)"] = time.perf_counter() - started
    return costs


def _lap(mark: float) -> tuple[float, float]:
    now = time.perf_counter()
    return now - mark, now


def run_floor(stack: Stack, pairs: list[tuple[str, str]], concurrency: int) -> tuple[float, list[dict[str, float]]]:
    """Every episode's floor, ``concurrency`` at a time; (seconds, costs per episode)."""
    catalog = TaskCatalog(stack.tasks)
    jobs = [(catalog.get(task_id), plan_commands(stack.demos, episode_id)) for episode_id, task_id in pairs]
    scratch = Path(tempfile.mkdtemp(prefix="floor-", dir=stack.work))
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        costs = list(pool.map(lambda i: floor_episode(*jobs[i], scratch / str(i)), range(len(jobs))))
    return time.perf_counter() - started, costs


def interpreter_start(runs: int = 20) -> float:
    """Median seconds of ``python3 -I -c pass`` (the sandbox's ``python3``): what any Python harness or grader pays
    before its first line."""
    python = shutil.which("python3", path=SANDBOX_PATH) or "python3"
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([python, "-I", "-c", "pass"], check=True)  # noqa: S603
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


# ---------------------------------------------------------------------------------------------------- report
def summarize(rows: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """(mean, median) in ms of every key of ``rows``."""
    keys = rows[0].keys()
    return {key: (statistics.fmean(r[key] for r in rows) * 1000, statistics.median(r[key] for r in rows) * 1000)
            for key in keys}  # fmt: skip


def report(results: dict[str, Any]) -> None:
    """Print the phase table and the throughput lines."""
    orchard, floor = results["orchard_ms"], results["floor_ms"]
    load = f"load average {results['load_before']} before, {results['load_after']} after; {os.cpu_count()} CPUs"
    print(f"\n{results['episodes']} file-lookup demonstrations at concurrency {results['concurrency']} ({load})\n")
    print(f"| phase | Orchard mean ms | Orchard p50 ms | floor mean ms |\n|{'---|' * 4}")
    for label in [label for label, _ in PHASES] + ["episode (started to ended)", "queue wait"]:
        mean, p50 = orchard[label]
        floor_key = FLOOR_PHASES.get(label, label)
        floor_ms = f"{floor[floor_key][0]:.1f}" if floor_key in floor else ""
        print(f"| {label} | {mean:.1f} | {p50:.1f} | {floor_ms} |")
    print(f"\nbare interpreter start (python3 -I -c pass): {results['interpreter_ms']:.1f} ms")
    rate, floor_rate = results["episodes_per_s"], results["floor_episodes_per_s"]
    print(f"Orchard: {rate:.2f} episodes/s ({1000 / rate:.0f} s per 1,000); floor: {floor_rate:.2f} episodes/s; "
          f"ratio {floor_rate / rate:.1f}x")  # fmt: skip
    cpu = dict(results["cpu_ms_per_episode"])
    machine, background = cpu.pop("machine"), results["background_cpu_per_s"] * 1000 / rate
    named = ", ".join(f"{name} {value:.1f}" for name, value in cpu.items())
    print(
        f"CPU ms per episode: {named} (sum {sum(cpu.values()):.1f}); the whole machine {machine:.1f}, of which "
        f"others' load, at its rate before the run, would be {background:.1f}"
    )


@contextmanager
def workspace(given: Path | None, keep: bool) -> Iterator[Path]:
    """The benchmark's work directory (a fresh temporary one unless given); removed afterwards unless kept."""
    work = given or Path(tempfile.mkdtemp(prefix="orchard-bench-episodes-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def measure(work: Path, episodes: int, concurrency: int) -> dict[str, Any]:
    """Run the Orchard episodes and the floor; every figure of the report."""
    stack = prepare(work, episodes)
    pairs = demonstrations(stack.demos)
    load_before, background = os.getloadavg()[0], background_cpu()
    try:
        start(stack, concurrency)
        wall, cpu = run_episodes(stack, pairs)
        events = episode_events(stack, [episode_id for episode_id, _ in pairs])
    finally:
        stop(stack)
    calls = model_calls(work / "bus")
    rows = [phase_costs(events[episode_id], calls[episode_id]) for episode_id, _ in pairs]
    floor_wall, floor_rows = run_floor(stack, pairs, concurrency)
    return {
        "episodes": episodes, "concurrency": concurrency,
        "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
        "orchard_ms": summarize(rows), "floor_ms": summarize(floor_rows),
        "episodes_per_s": episodes / wall, "floor_episodes_per_s": episodes / floor_wall,
        "cpu_ms_per_episode": {name: seconds * 1000 / episodes for name, seconds in cpu.items()},
        "interpreter_ms": interpreter_start() * 1000, "background_cpu_per_s": background,
    }  # fmt: skip


def main() -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=200, help="Demonstration episodes to run.")
    parser.add_argument("--concurrency", type=int, default=4, help="The Env's concurrency (the recipe's: 4).")
    parser.add_argument("--work-dir", type=Path, help="Where tasks, bus and logs go (default: a temporary dir).")
    parser.add_argument("--keep", action="store_true", help="Keep the work directory.")
    parser.add_argument("--json", type=Path, help="Also write the figures to this file.")
    args = parser.parse_args()
    with workspace(args.work_dir, args.keep) as work:
        results = measure(work, args.episodes, args.concurrency)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
