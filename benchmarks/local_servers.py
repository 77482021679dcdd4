"""Servers a benchmark starts as child processes: a free port, waiting until one answers, stopping them in order."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(
    url: str, process: subprocess.Popen[bytes], *, timeout_s: float, interval_s: float, log: Path | None = None
) -> None:
    """Poll ``url`` until it answers 200; ``RuntimeError`` (with the end of the server's log, where it has one) if
    the process exits first or ``timeout_s`` passes."""
    tail = (lambda: ":\n" + log.read_text()[-3000:]) if log is not None else (lambda: "")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}{tail()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{url} did not answer in {timeout_s:g} s{tail()}")


def stop_in_order(processes: Mapping[str, subprocess.Popen[bytes]], order: tuple[str, ...]) -> None:
    """Terminate the named servers one after another (a server that cleans up after others goes first), killing
    one that has not exited 30 s after its SIGTERM."""
    for name in order:
        process = processes.get(name)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
