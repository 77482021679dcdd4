"""Exec streams of the Kubernetes runtime: the WebSocket of ``connect_get_namespaced_pod_exec`` (through
``kubernetes.stream.stream``, binary mode) as the runtime reads and writes it: stdin fed in chunks, output drained
from channels 1 and 2, the exit code read from the status channel (3), and a terminal (``tty``) session over it."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import IO, Any, Literal, Protocol

from orchard.sandbox import PtySession
from orchard.sandbox.kubernetes.errors import KubernetesRuntimeError, unreachable_is_a_runtime_error

StreamEvent = tuple[Literal["stdout", "stderr", "exit"], bytes | int | None]
CHUNK = 64 * 1024
# Go's ExitError text ends kwok's message; the command line, which may hold anything, comes before it.
_EXIT_STATUS_MESSAGE = re.compile(r"\bexit status (\d+)\s*$")
_OUTPUT_CHANNELS: tuple[tuple[int, Literal["stdout", "stderr"]], ...] = ((1, "stdout"), (2, "stderr"))


class ExecStream(Protocol):
    """The part of ``kubernetes.stream.ws_client.WSClient`` the runtime uses (binary mode)."""

    def is_open(self) -> bool:
        """Whether the server has not closed the stream yet."""

    def update(self, timeout: float | None = 0) -> None:
        """Buffer the frames that arrive within ``timeout`` seconds."""

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        """Take what is buffered on a channel (1 stdout, 2 stderr, 3 status)."""

    def write_stdin(self, data: bytes) -> None:
        """Send bytes to the command's stdin."""

    def close(self, **kwargs: Any) -> None:
        """Close the WebSocket."""


def exit_code_of(status: bytes) -> int:
    """The exit code in an exec's status channel (``v1.Status`` JSON)."""
    if not status:
        raise KubernetesRuntimeError("exec stream closed without an exit status")
    try:
        parsed = json.loads(status)
    except ValueError as exc:
        raise KubernetesRuntimeError(f"unreadable exec status {status[:200]!r}") from exc
    if parsed.get("status") == "Success":
        return 0
    for cause in parsed.get("details", {}).get("causes", []):
        if cause.get("reason") == "ExitCode":
            return int(cause["message"])
    # A kubelet that is not the reference one (kwok's, for one) reports a non-zero exit only in its message.
    found = _EXIT_STATUS_MESSAGE.search(str(parsed.get("message", "")))
    if found is not None:
        return int(found.group(1))
    raise KubernetesRuntimeError(f"exec failed: {parsed.get('message', parsed)}")


def feed_stdin(ws: ExecStream, stdin: IO[bytes]) -> None:
    """Send all of ``stdin`` to the command, in chunks."""
    while chunk := stdin.read(CHUNK):
        ws.write_stdin(chunk)
        ws.update(timeout=0)  # buffer output meanwhile, so neither side's buffers fill up


def drain_output(ws: ExecStream) -> Iterator[StreamEvent]:
    """What is buffered on stdout and stderr, as stream events."""
    for channel, kind in _OUTPUT_CHANNELS:
        data = ws.read_channel(channel)
        if data:
            yield kind, data


class KubernetesPtySession(PtySession):
    """A process on a terminal in the pod: an exec with ``tty`` over the API server's WebSocket (stdout carries the
    terminal's output, channel 4 its size)."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._exit: int | None = None
        self._status = b""

    @unreachable_is_a_runtime_error
    def read(self, max_bytes: int = 65536, timeout_s: float = 1.0) -> bytes | None:
        """Terminal output; ``None`` when nothing came within ``timeout_s``; ``b""`` once the terminal closed."""
        deadline = time.monotonic() + timeout_s
        while True:
            data = self._ws.read_channel(1)
            if data:
                return data if isinstance(data, bytes) else data.encode()
            if not self._ws.is_open():
                self._collect_status()
                return b""
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._ws.update(timeout=min(remaining, 0.2))

    @unreachable_is_a_runtime_error
    def write(self, data: bytes) -> None:
        """Keystrokes to the process."""
        self._ws.write_stdin(data)

    @unreachable_is_a_runtime_error
    def resize(self, cols: int, rows: int) -> None:
        """Tell the terminal its new size."""
        self._ws.write_channel(4, json.dumps({"Width": cols, "Height": rows}))

    @unreachable_is_a_runtime_error
    def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit status once the stream closed (output read meanwhile is kept for ``read``)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._ws.is_open():
            if deadline is not None and time.monotonic() >= deadline:
                return None
            self._ws.update(timeout=0.2)
        return self._collect_status()

    def close(self) -> None:
        """Close the stream: the terminal hangs up, which ends the process."""
        self._ws.close()

    def _collect_status(self) -> int | None:
        self._status += self._ws.read_channel(3) or b""
        if self._exit is None and self._status:
            self._exit = exit_code_of(self._status)
        return self._exit
