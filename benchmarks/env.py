"""Local sandbox runtime: create-to-ready latency, creation throughput, exec round trip, in one run.

Prints one table:

- create-to-ready: ``LocalRuntime.create`` until it returns (the sandbox is ready for ``exec``), and until a first
  ``exec(["true"])`` has answered, p50/p99;
- sandboxes per second for N create+delete cycles (default 1,000), on the runtime directly (a thread pool) and
  through the REST API (the async SDK against a uvicorn server in its own process), with the success count;
- ``exec`` round trip of ``true``: ``subprocess.run(["true"])`` on the host, ``LocalSandbox.exec`` directly, and
  the REST API through the sync SDK, p50/p99, one after the other in the same run.

    python benchmarks/env.py [--sandboxes 1000] [--execs 300] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orchard.sandbox import SandboxSpec
from orchard.sandbox.client import AsyncSandboxClient, SandboxClient
from orchard.sandbox.local.runtime import LocalRuntime

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_servers import free_port, wait_healthy  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

console = Console()
SERVER = """
import sys, uvicorn
from pathlib import Path
from orchard.sandbox.api import create_sandbox_app
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.logging import configure_logging
configure_logging("json", "WARNING")
runtime = LocalRuntime(Path(sys.argv[1]))
try:
    uvicorn.run(create_sandbox_app(runtime, sys.argv[3]), host="127.0.0.1", port=int(sys.argv[2]),
                log_level="warning", ws="websockets-sansio")
finally:
    runtime.close()
"""


def spec(sandbox_id: str, source: Path) -> SandboxSpec:
    """A small task: a few files, like a unit-test fixture repository."""
    return SandboxSpec(sandbox_id=sandbox_id, run_id="bench", episode_id=sandbox_id, task_id="bench", source_dir=source)


def make_source(root: Path) -> Path:
    """A 10-file task directory."""
    source = root / "task"
    (source / "pkg").mkdir(parents=True)
    for i in range(10):
        (source / "pkg" / f"mod{i}.py").write_text(f"VALUE = {i}\n" * 20)
    return source


def percentiles(samples_ms: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    ordered = sorted(samples_ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def timed(fn: Callable[[], object]) -> float:
    """Milliseconds one call takes."""
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000.0


def bench_create_latency(runtime: LocalRuntime, source: Path, count: int) -> tuple[list[float], list[float]]:
    """Sequential creates: time to ready, and to a first answered exec."""
    ready, first_exec = [], []
    for i in range(count):
        started = time.perf_counter()
        sandbox = runtime.create(spec(f"lat-{i}", source))
        ready.append((time.perf_counter() - started) * 1000.0)
        sandbox.exec(["true"])
        first_exec.append((time.perf_counter() - started) * 1000.0)
        runtime.delete(sandbox.spec.sandbox_id)
    return ready, first_exec


def bench_direct_throughput(runtime: LocalRuntime, source: Path, count: int, workers: int) -> tuple[float, int]:
    """create+delete ``count`` sandboxes on ``workers`` threads; (per second, successes)."""

    def cycle(i: int) -> bool:
        runtime.create(spec(f"tp-{i}", source))
        runtime.delete(f"tp-{i}")
        return True

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        ok = sum(1 for f in [pool.submit(cycle, i) for i in range(count)] if f.exception() is None and f.result())
    return count / (time.perf_counter() - started), ok


async def bench_rest_throughput(url: str, token: str, source: Path, count: int, workers: int) -> tuple[float, int]:
    """create+delete ``count`` sandboxes through the API, ``workers`` at a time; (per second, successes)."""
    gate = asyncio.Semaphore(workers)
    async with AsyncSandboxClient(url, token, timeout_s=120) as sdk:

        async def cycle(i: int) -> bool:
            async with gate:
                sandbox = await sdk.create(spec(f"rest-{i}", source))
                await sandbox.close()
                return True

        started = time.perf_counter()
        results = await asyncio.gather(*(cycle(i) for i in range(count)), return_exceptions=True)
        elapsed = time.perf_counter() - started
    return count / elapsed, sum(1 for r in results if r is True)


def start_server(root: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    """The API in its own process (so client and server do not share a GIL); waits until it answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(root), str(port), token], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/healthz", server, timeout_s=30, interval_s=0.05)
    except RuntimeError:
        server.kill()
        raise RuntimeError("the sandbox API server did not start") from None
    return server, url


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=1000, help="create+delete cycles per throughput run")
    parser.add_argument("--latency", type=int, default=100, help="sequential creates for the latency figures")
    parser.add_argument("--execs", type=int, default=300, help="exec round trips per path")
    parser.add_argument("--concurrency", type=int, default=16, help="creates in flight at once")
    args = parser.parse_args()
    from orchard.logging import configure_logging

    configure_logging("console", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-env-"))
    source = make_source(work)
    runtime = LocalRuntime(work / "direct")
    token = secrets.token_urlsafe(16)
    server, url = start_server(work / "rest", token)
    table = Table(title=f"Local sandbox runtime ({runtime.isolation.describe()}; {os.cpu_count()} CPUs)")
    for column in ("measure", "p50 / rate", "p99 / successes"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    try:
        ready, first = bench_create_latency(runtime, source, args.latency)
        table.add_row("create-to-ready, direct (ms)", *(f"{v:.1f}" for v in percentiles(ready)))
        table.add_row("create + first exec answered, direct (ms)", *(f"{v:.1f}" for v in percentiles(first)))
        rate, ok = bench_direct_throughput(runtime, source, args.sandboxes, args.concurrency)
        table.add_row(f"create+delete x{args.sandboxes}, direct (/s)", f"{rate:.1f}/s", f"{ok}/{args.sandboxes}")
        rate, ok = asyncio.run(bench_rest_throughput(url, token, source, args.sandboxes, args.concurrency))
        table.add_row(f"create+delete x{args.sandboxes}, REST (/s)", f"{rate:.1f}/s", f"{ok}/{args.sandboxes}")
        host = [timed(lambda: subprocess.run(["true"], check=True)) for _ in range(args.execs)]
        box = runtime.create(spec("exec-direct", source))
        direct = [timed(lambda: box.exec(["true"])) for _ in range(args.execs)]
        with SandboxClient(url, token) as client:
            remote = client.create(spec("exec-rest", source))
            rest = [timed(lambda: remote.exec(["true"])) for _ in range(args.execs)]
            remote.close()
        for label, samples in (("subprocess.run(['true']) on the host", host), ("exec true, direct", direct)):
            table.add_row(f"{label} (ms)", *(f"{v:.2f}" for v in percentiles(samples)))
        table.add_row("exec true, REST API (ms)", *(f"{v:.2f}" for v in percentiles(rest)))
    finally:
        runtime.close()
        server.terminate()
        server.wait(30)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    console.print(table)


if __name__ == "__main__":
    main()
