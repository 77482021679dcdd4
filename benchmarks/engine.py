"""Local engine throughput and hot-reload latency, beside a bare ``model.generate`` loop in the same run.

The engine runs as a real server in its own process (``serve_engine``, as ``orchard engine serve`` runs it, with
hot reload on an embedded bus and a local store in a temporary directory); this process is the client. Two tables:

- **throughput** with 1, 8 and 32 concurrent clients (greedy chat requests): tokens/s through the engine over HTTP,
  through the same scheduler called in-process (no HTTP), and from ``model.generate`` on the same prompts in static
  batches of the same size (left padding, same ``max_new_tokens``). Tokens are counted up to and including the end
  of turn everywhere, so the ratio compares equal work. Each figure is the best of ``--repeats`` interleaved runs:
  on a shared machine other load only ever slows a run down;
- **reload**: seconds from a ``PolicyVersion`` record being acknowledged on the bus (``publish_policy_version``
  returning) to the first streamed token of the first request served by the new weights, while 8 clients keep
  streaming (a request in flight finishes on its old version, so this includes waiting for a client's next request),
  and the reloader's own share of it (fetch + sha256 verification + load, from the engine's ``/healthz``).

Everything runs on a tiny model built here (nothing is downloaded). ``--threads`` sets torch's intra-op threads of
both processes (1 by default: steady on a shared machine; OpenMP threads that lose their core stall every op).

    python benchmarks/engine.py [--model tiny-llama] [--max-tokens 64] [--threads 1] [--device cpu]
                                [--reloads 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from rich.table import Table

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.local import LocalEngine, load_model
from orchard.engines.tiny import build_tiny_checkpoint
from orchard.logging import configure_logging
from orchard.store import open_store
from trainers.weights import publish_policy_version

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_runs import Conversation, generate_run, scheduler_run, tokens_per_second  # noqa: E402
from local_servers import free_port, wait_healthy  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

console = Console()
CONCURRENCY = (1, 8, 32)
SERVED_NAME = "bench"
RUN_ID = "bench"


def prompts(count: int) -> list[Conversation]:
    """Distinct short conversations of different lengths."""
    return [
        [{"role": "user", "content": f"Task {i}: " + "explain the failing test and propose a fix. " * (1 + i % 5)}]
        for i in range(count)
    ]


# ---------------------------------------------------------------------------------------------------- the server
def start_server(work: Path, checkpoint: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    """``serve_engine`` in a child process, following policy versions of run ``bench``; return it and its URL."""
    port = free_port()
    engine_config = {
        "model": str(checkpoint),
        "served_model_name": SERVED_NAME,
        "port": port,
        "max_batch_size": 32,
        "max_queue": 1024,
        "device": args.device,
        "cpu_threads": args.threads,
        "policy_updates": {"enabled": True, "model": "policy", "poll_timeout_s": 0.05},
    }
    orchard_config = {
        "run_id": RUN_ID,
        "bus": {"type": "embedded", "path": str(work / "bus")},
        "store": {"type": "local", "path": str(work / "store")},
    }
    code = (
        "import json, sys\n"
        "from orchard.config import OrchardConfig\n"
        "from orchard.engines.config import EngineConfig\n"
        "from orchard.engines.server import serve_engine\n"
        "from orchard.logging import configure_logging\n"
        "configure_logging('console', 'WARNING')\n"
        "serve_engine(EngineConfig.model_validate_json(sys.argv[1]), OrchardConfig(**json.loads(sys.argv[2])))\n"
    )
    argv = [sys.executable, "-c", code, json.dumps(engine_config), json.dumps(orchard_config)]
    process = subprocess.Popen(argv, env=os.environ | {"OMP_NUM_THREADS": str(args.threads)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/healthz", process, timeout_s=120, interval_s=0.2)
    except RuntimeError:
        process.kill()
        raise RuntimeError("the engine server did not start") from None
    return process, url


# ---------------------------------------------------------------------------------------------------- throughput
async def http_run(url: str, conversations: list[Conversation], concurrency: int, max_tokens: int) -> int:
    """Send every conversation with ``concurrency`` clients; return the completion tokens generated."""
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conversation in conversations:
        queue.put_nowait(conversation)
    total = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal total
        while not queue.empty():
            body = {"model": SERVED_NAME, "messages": queue.get_nowait(), "max_tokens": max_tokens, "temperature": 0}
            answer = await http.post("/v1/chat/completions", json=body)
            answer.raise_for_status()
            total += len(answer.json()["orchard"]["completion_token_ids"])

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=64)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    return total


def throughput(
    url: str, engine: LocalEngine, max_tokens: int, repeats: int
) -> list[tuple[int, int, float, float, float]]:
    """Rows of (concurrency, requests, HTTP tok/s, scheduler tok/s, generate tok/s), each the best of ``repeats``
    interleaved runs (a shared machine's other load only ever slows a run down)."""
    rows = []
    asyncio.run(http_run(url, prompts(2), 1, 8))  # warm-up
    for concurrency in CONCURRENCY:
        conversations = prompts(max(16, 2 * concurrency))
        runs: list[tuple[float, float, float]] = []
        work, weights = (conversations, concurrency, max_tokens), (engine.checkpoint, engine.device, engine.dtype)
        for _ in range(repeats):
            http = tokens_per_second(lambda: asyncio.run(http_run(url, *work)))  # noqa: B023
            direct = tokens_per_second(lambda: asyncio.run(scheduler_run(engine, *work)))  # noqa: B023
            generate = tokens_per_second(lambda: generate_run(engine, load_model(*weights), *work))  # noqa: B023
            runs.append((http, direct, generate))
        http, direct, generate = (max(column) for column in zip(*runs, strict=True))
        rows.append((concurrency, len(conversations), http, direct, generate))
        console.print(
            f"{concurrency} concurrent: http {http:.0f}, scheduler {direct:.0f}, generate {generate:.0f} tok/s"
        )
    return rows


# ---------------------------------------------------------------------------------------------------- reload
async def _streaming_client(url: str, worker: int, stop: asyncio.Event, seen: list[tuple[int, float]]) -> None:
    """Stream requests until ``stop``; record (version, time of its first token) per request."""
    conversation = prompts(worker + 1)[-1]
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        while not stop.is_set():
            first: float | None = None
            body = {"model": SERVED_NAME, "messages": conversation, "max_tokens": 64, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if first is None and chunk["choices"] and "role" not in chunk["choices"][0]["delta"]:
                        first = time.time()
                    if "orchard" in chunk:
                        seen.append((chunk["orchard"]["policy_version"], first or time.time()))


async def reload_run(url: str, work: Path, model: str, versions: int) -> list[tuple[int, float, float]]:
    """Publish ``versions`` new versions under load; rows of (version, record acked -> first token s, the
    reloader's own fetch + verify + load s)."""
    bus = open_bus(EmbeddedBusConfig(path=work / "bus"))
    store = open_store(LocalStoreConfig(path=work / "store"))
    producer = bus.producer()
    stop, seen = asyncio.Event(), []
    clients = [asyncio.create_task(_streaming_client(url, w, stop, seen)) for w in range(8)]
    rows = []
    try:
        for version in range(1, versions + 1):
            checkpoint = build_tiny_checkpoint(model, work / f"v{version}", seed=version)
            files = {p.name: p for p in checkpoint.iterdir() if p.is_file()}
            await asyncio.sleep(1.0)
            await asyncio.to_thread(
                publish_policy_version,
                store,
                producer,
                run_id=RUN_ID,
                model="policy",
                version=version,
                files=files,
                trainer_step=version,
            )
            acknowledged = time.time()
            while not any(v == version for v, _ in seen):
                await asyncio.sleep(0.01)
            first_token = min(t for v, t in seen if v == version) - acknowledged
            health = (await asyncio.to_thread(httpx.get, f"{url}/healthz")).json()
            reloader_s = next(e["seconds"] for e in health["reloads"] if e["version"] == version)
            rows.append((version, first_token, reloader_s))
    finally:
        stop.set()
        await asyncio.gather(*clients)
        producer.close()
        bus.close()
    return rows


# ---------------------------------------------------------------------------------------------------- main
def main() -> None:
    """Run the measurements and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", help="tiny-family name to build and serve")
    parser.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (each process)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, auto")
    parser.add_argument("--reloads", type=int, default=3, help="versions published in the reload measurement")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per row (the best is reported)")
    args = parser.parse_args()
    configure_logging("console", "WARNING")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="orchard-bench-engine-") as tmp:
        work = Path(tmp)
        checkpoint = build_tiny_checkpoint(args.model, work / "v0", seed=0)
        engine = LocalEngine(checkpoint, model_name=SERVED_NAME, max_batch_size=32, max_queue=1024, device=args.device)
        engine.start()
        server, url = start_server(work, checkpoint, args)
        try:
            rows = throughput(url, engine, args.max_tokens, args.repeats)
            reloads = asyncio.run(reload_run(url, work, args.model, args.reloads))
        finally:
            server.terminate()
            server.wait(30)
            engine.close()
        _print(args, engine, rows, reloads)


def _print(
    args: argparse.Namespace,
    engine: LocalEngine,
    rows: list[tuple[int, int, float, float, float]],
    reloads: list[tuple[int, float, float]],
) -> None:
    parameters = sum(p.numel() for p in engine.scheduler.serving.model.parameters())
    dtype = str(engine.dtype).removeprefix("torch.")
    title = (
        f"{args.model} ({parameters / 1e6:.1f}M parameters, {engine.device}, {dtype}, {args.threads} thread(s)), "
        f"greedy, {args.max_tokens} max tokens, best of {args.repeats}"
    )
    table = Table(title=title)
    columns = ("concurrent", "requests", "engine HTTP tok/s", "scheduler tok/s", "generate tok/s", "HTTP / generate")
    for column in columns:
        table.add_column(column, justify="right")
    for concurrency, requests, http, direct, generate in rows:
        table.add_row(
            str(concurrency), str(requests), f"{http:.0f}", f"{direct:.0f}", f"{generate:.0f}", f"{http / generate:.2f}"
        )
    console.print(table)
    reload_table = Table(title="Hot reload under load (8 streaming clients)")
    reload_table.add_column("version", justify="right")
    reload_table.add_column("record acked -> first token on it (s)", justify="right")
    reload_table.add_column("of which fetch + sha256 + load (s)", justify="right")
    for version, seconds, reloader_s in reloads:
        reload_table.add_row(str(version), f"{seconds:.3f}", f"{reloader_s:.3f}")
    medians = (statistics.median(r[1] for r in reloads), statistics.median(r[2] for r in reloads))
    reload_table.add_row("median", f"{medians[0]:.3f}", f"{medians[1]:.3f}")
    console.print(reload_table)


if __name__ == "__main__":
    main()
