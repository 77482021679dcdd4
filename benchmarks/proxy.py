"""Recording proxy benchmark: added latency against the backend called directly, and recorded calls/s at saturation.

Starts the scripted backend and the recording proxy (embedded bus in a temporary directory) as two separate processes
on loopback, then, in the same run:

1. **latency**: one call in flight at a time, alternating a direct call to the backend and the same call through the
   proxy, for chat completions and the Responses API, streamed (time to the last byte) and not. Each conversation
   grows like an agent's (the reply and a tool result are appended after every call, a fresh episode every
   ``--episode-calls`` calls), so the proxy does its real per-call work: prefix-delta encoding, lineage, bus writes.
   The added latency is the proxy's percentile minus the direct percentile. Prompts grow from ~1K to ~9K tokens
   (~5K on average; the scripted tokenizer makes ~3 bytes a token), completions are ~130 tokens. The CPU columns are
   the CPU time (all threads) each server process spent per call: unlike latency, they hardly move on a busy machine.
2. **saturation**: ``--concurrency`` concurrent harnesses (one episode each) call through the proxy as fast as they
   can; then every episode is closed, which returns only once the bus acknowledged all its calls. Recorded calls/s is
   acknowledged calls over the time from the first request to the last close. The same load straight at the backend is
   shown for reference, and the proxy's CPU use (a share of one core: near 100% means the proxy is the bottleneck; well
   below, the client or the backend is).

    .venv/bin/python benchmarks/proxy.py                     # defaults: 400 calls per latency row, 16 harnesses
    .venv/bin/python benchmarks/proxy.py --calls 1000 --saturation-calls 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig

REPO = Path(__file__).resolve().parents[1]
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
SYSTEM = "You are a careful software engineer. " * 60  # ~2 KB system prompt
TOOLS = [
    {
        "type": "function",
        "function": {"name": "shell", "description": "Run a command.", "parameters": {"type": "object"}},
    }
]
TOOL_OUTPUT = "tests/test_parse.py::test_strip FAILED\n" * 12  # ~500 B per tool result
FINAL_TEXT = "I ran the tests and inspected the parser; the fix strips whitespace before tokenizing. " * 4

BACKEND_CODE = """
import sys
from orchard.logging import configure_logging
from orchard.engines.config import ScriptedEngineConfig
from orchard.engines.server import serve_engine
configure_logging("json", "WARNING")
serve_engine(ScriptedEngineConfig(plan=sys.argv[1], port=int(sys.argv[2]), policy_version=1))
"""
PROXY_CODE = """
import sys
from orchard.config import EmbeddedBusConfig, OrchardConfig
from orchard.logging import configure_logging
from producers.proxy import ProxySettings, serve_proxy
configure_logging("json", "WARNING")
settings = ProxySettings(backend_base_url=sys.argv[1], admin_token=sys.argv[2])
serve_proxy(settings, OrchardConfig(bus=EmbeddedBusConfig(path=sys.argv[3])), port=int(sys.argv[4]))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def process(code: str, *args: str, ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``code`` in a fresh interpreter until the block ends; wait until ``ready_url`` answers."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(ready_url, timeout=1).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{ready_url} did not come up")
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU time a process has used so far (Linux ``/proc``), all its threads."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------ conversations
@dataclass
class Conversation:
    """An agent's growing history for one API flavour, reset every ``limit`` calls."""

    flavour: str
    limit: int
    items: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0

    def body(self, stream: bool) -> dict[str, Any]:
        if self.calls % self.limit == 0:
            self.items = [{"role": "user", "content": f"Fix the failing test. Attempt {self.calls}."}]
        if self.flavour == "chat":
            messages = [{"role": "system", "content": SYSTEM}, *self.items]
            return {"model": "policy", "messages": messages, "tools": TOOLS, "stream": stream, "temperature": 1.0}
        return {"model": "policy", "input": self.items, "instructions": SYSTEM, "tools": TOOLS, "stream": stream}

    def advance(self, reply: dict[str, Any] | None) -> None:
        """Append the reply (chat message or Responses output) and a tool result."""
        self.calls += 1
        if self.flavour == "chat":
            message = reply or {"role": "assistant", "content": FINAL_TEXT}
            self.items += [message, {"role": "tool", "tool_call_id": "call_0_0", "content": TOOL_OUTPUT}]
        else:
            text = {"type": "output_text", "text": FINAL_TEXT}
            output = reply or [{"type": "message", "role": "assistant", "content": [text]}]
            self.items += [*output, {"type": "function_call_output", "call_id": "call_0_0", "output": TOOL_OUTPUT}]


def reply_of(flavour: str, answer: dict[str, Any]) -> Any:
    return answer["choices"][0]["message"] if flavour == "chat" else answer["output"]


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


# ------------------------------------------------------------------------------------------------ latency
class Admin:
    def __init__(self, url: str, token: str) -> None:
        self.client = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60)

    def open(self, episode_id: str) -> str:
        spec = {"episode_id": episode_id, "task_id": "bench", "harness": "bench", "model": "policy", "ttl_s": 3600}
        response = self.client.post("/admin/episodes", json=spec)
        response.raise_for_status()
        return str(response.json()["token"])

    def close(self, episode_id: str) -> dict[str, Any]:
        response = self.client.delete(f"/admin/episodes/{episode_id}")
        response.raise_for_status()
        return dict(response.json())


def timed_call(client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str]) -> float:
    started = time.perf_counter()
    if body["stream"]:
        with client.stream("POST", url, json=body, headers=headers) as response:
            for _ in response.iter_bytes():
                pass
    else:
        response = client.post(url, json=body, headers=headers)
    elapsed = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code}")
    return elapsed * 1000


def latency_row(
    client: httpx.Client,
    urls: tuple[str, str],
    admin: Admin,
    flavour: str,
    stream: bool,
    calls: int,
    limit: int,
    name: str = "lat",
) -> tuple[np.ndarray, np.ndarray]:
    direct_ms, proxy_ms = [], []
    conversation = Conversation(flavour, limit)
    token, episode = "", ""
    for i in range(calls):
        if i % limit == 0:
            if episode:
                admin.close(episode)
            episode = f"{name}-{flavour}-{stream}-{i}"
            token = admin.open(episode)
        body = conversation.body(stream)
        direct_headers = {"X-Orchard-Plan-Key": episode}
        direct_ms.append(timed_call(client, urls[0] + PATHS[flavour], body, direct_headers))
        proxy_ms.append(timed_call(client, urls[1] + PATHS[flavour], body, {"authorization": f"Bearer {token}"}))
        conversation.advance(None)
    admin.close(episode)
    return np.array(direct_ms), np.array(proxy_ms)


# ------------------------------------------------------------------------------------------------ saturation
async def saturate(base: str, tokens: list[str], total: int, limit: int) -> float:
    """Run ``total`` non-streamed chat calls from ``len(tokens)`` concurrent harnesses; return seconds taken."""
    remaining = [total]

    async def harness(client: httpx.AsyncClient, token: str) -> None:
        conversation = Conversation("chat", limit)
        headers = {"authorization": f"Bearer {token}", "X-Orchard-Plan-Key": token}
        while remaining[0] > 0:
            remaining[0] -= 1
            response = await client.post(PATHS["chat"], json=conversation.body(False), headers=headers)
            if response.status_code != 200:
                raise RuntimeError(f"saturation call failed: {response.status_code} {response.text[:200]}")
            conversation.advance(None)

    limits = httpx.Limits(max_connections=len(tokens), max_keepalive_connections=len(tokens))
    transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=NODELAY)
    async with httpx.AsyncClient(base_url=base, transport=transport, timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(*(harness(client, token) for token in tokens))
        return time.perf_counter() - started


async def close_all(admin_url: str, admin_token: str, episodes: list[str]) -> int:
    async with httpx.AsyncClient(
        base_url=admin_url, headers={"authorization": f"Bearer {admin_token}"}, timeout=120
    ) as c:
        summaries = await asyncio.gather(*(c.delete(f"/admin/episodes/{e}") for e in episodes))
    return sum(int(s.json()["calls_recorded"]) for s in summaries)


def saturation(
    urls: tuple[str, str], admin: Admin, admin_token: str, args: argparse.Namespace, proxy: subprocess.Popen[bytes]
) -> dict[str, float]:
    episodes = [f"sat-{i}" for i in range(args.concurrency)]
    tokens = [admin.open(e) for e in episodes]
    keys = [f"direct-{i}" for i in range(args.concurrency)]
    direct_s = asyncio.run(saturate(urls[0], keys, args.saturation_calls, args.episode_calls))
    started, cpu = time.perf_counter(), cpu_seconds(proxy)
    answered_s = asyncio.run(saturate(urls[1], tokens, args.saturation_calls, args.episode_calls))
    recorded = asyncio.run(close_all(urls[1], admin_token, episodes))
    recorded_s = time.perf_counter() - started
    return {
        "calls": args.saturation_calls,
        "direct_per_s": args.saturation_calls / direct_s,
        "answered_per_s": args.saturation_calls / answered_s,
        "recorded": recorded,
        "recorded_per_s": recorded / recorded_s,
        "proxy_busy": (cpu_seconds(proxy) - cpu) / recorded_s,
    }


# ------------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per latency row (each direct and proxied)")
    parser.add_argument("--episode-calls", type=int, default=30, help="calls per episode before a fresh one")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent harnesses at saturation")
    parser.add_argument("--saturation-calls", type=int, default=4000, help="calls made at saturation")
    args = parser.parse_args()

    console = Console()
    admin_token = secrets.token_hex(16)
    backend_port, proxy_port = free_port(), free_port()
    backend_url, proxy_url = f"http://127.0.0.1:{backend_port}", f"http://127.0.0.1:{proxy_port}"
    with tempfile.TemporaryDirectory(prefix="orchard-proxy-bench-") as tmp:
        plan = Path(tmp) / "plan.json"
        plan.write_text(json.dumps({"steps": [], "final_text": FINAL_TEXT}))
        bus_path = Path(tmp) / "bus"
        with open_bus(EmbeddedBusConfig(path=bus_path)) as bus:
            bus.create_topic("model-calls", partitions=8)
        proxy_args = (f"{backend_url}/v1", admin_token, str(bus_path), str(proxy_port))
        with (
            process(BACKEND_CODE, str(plan), str(backend_port), ready_url=f"{backend_url}/v1/models") as backend,
            process(PROXY_CODE, *proxy_args, ready_url=f"{proxy_url}/healthz") as proxy,
        ):
            admin = Admin(proxy_url, admin_token)
            client = httpx.Client(timeout=60, transport=httpx.HTTPTransport(socket_options=NODELAY))
            urls = (backend_url, proxy_url)
            for flavour in ("chat", "responses"):  # warm up both servers and connections
                latency_row(client, urls, admin, flavour, False, 20, args.episode_calls, "warm")
            rows = []
            for flavour in ("chat", "responses"):
                for stream in (False, True):
                    cpu = (cpu_seconds(backend), cpu_seconds(proxy))
                    direct, proxied = latency_row(client, urls, admin, flavour, stream, args.calls, args.episode_calls)
                    backend_cpu = (cpu_seconds(backend) - cpu[0]) * 1000 / (2 * args.calls)
                    proxy_cpu = (cpu_seconds(proxy) - cpu[1]) * 1000 / args.calls
                    rows.append((flavour, stream, direct, proxied, backend_cpu, proxy_cpu))
            sat = saturation(urls, admin, admin_token, args, proxy)
    print_tables(console, rows, sat, args)


def print_tables(console: Console, rows: list[Any], sat: dict[str, float], args: argparse.Namespace) -> None:
    where = f"{args.calls} calls per row, one in flight, loopback, {os.cpu_count()} CPUs"
    title = f"Recording proxy: added latency in ms ({where})"
    table = Table(title=title)
    columns = ("API", "stream", "direct p50", "direct p99", "proxy p50", "proxy p99", "added p50", "added p99")
    for column in (*columns, "backend CPU/call", "proxy CPU/call"):
        table.add_column(column, justify="right" if column not in ("API", "stream") else "left")
    for flavour, stream, direct, proxied, backend_cpu, proxy_cpu in rows:
        d50, d99, p50, p99 = (float(np.percentile(a, q)) for a in (direct, proxied) for q in (50, 99))
        table.add_row(
            "chat" if flavour == "chat" else "responses",
            "yes" if stream else "no",
            *(f"{v:.2f}" for v in (d50, d99, p50, p99, p50 - d50, p99 - d99, backend_cpu, proxy_cpu)),
        )
    console.print(table)
    table = Table(title=f"Saturation: {args.concurrency} concurrent harnesses, non-streamed chat, embedded bus")
    for column in ("calls", "backend direct", "through proxy (answered)", "recorded + acknowledged", "proxy CPU"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{sat['calls']:,.0f} ({sat['recorded']:,.0f} recorded)",
        f"{sat['direct_per_s']:,.0f} calls/s",
        f"{sat['answered_per_s']:,.0f} calls/s",
        f"{sat['recorded_per_s']:,.0f} calls/s",
        f"{sat['proxy_busy']:.0%} of a core",
    )
    console.print(table)


if __name__ == "__main__":
    main()
