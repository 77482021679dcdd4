"""The built-in agent's standard-library HTTP client (framing, retries, what it sends) and its start-up imports."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from orchard.harnesses import builtin_agent
from orchard.harnesses.builtin_agent import (
    TOOLS,
    AgentConfig,
    ChatClient,
    HttpResponse,
    ModelError,
    TransportError,
    read_response,
)

COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
STARTUP_FORBIDDEN = {"httpx", "pydantic", "typing", "dataclasses", "pathlib", "http.client", "ssl", "email", "shutil",
                     "urllib.parse", "encodings.idna"}  # fmt: skip
"""What the agent must not import to start and make a call: each one is paid by every episode."""


def parsed(raw: bytes) -> tuple[int, bytes]:
    response = read_response(io.BufferedReader(io.BytesIO(raw)))  # type: ignore[arg-type]
    return response.status_code, response.content


def test_response_bodies_framed_by_length_chunks_or_the_end_of_the_connection() -> None:
    assert parsed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello, and more") == (200, b"hello")
    chunked = (
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n2\r\n, \r\n0\r\nX: y\r\n\r\n"
    )
    assert parsed(chunked) == (201, b"hello, ")
    assert parsed(b"HTTP/1.0 503 Busy\r\nContent-Type: text/plain\r\n\r\nall of it") == (503, b"all of it")
    assert parsed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") == (200, b"ok")


@pytest.mark.parametrize(
    "raw",
    [b"", b"SSH-2.0-OpenSSH\r\n", b"HTTP/1.1 2xx Odd\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
     b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
    ids=["empty", "not-http", "bad-status", "short-body", "cut-headers", "bad-chunk"],
)  # fmt: skip
def test_a_response_that_is_not_whole_http_is_a_transport_error(raw: bytes) -> None:
    with pytest.raises(TransportError):
        parsed(raw)


class Backend(BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body) of the server's ``answers``; records each request."""

    def do_POST(self) -> None:
        server: Any = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        server.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
        status, answer = server.answers.pop(0)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def backend() -> Iterator[Any]:
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    server.requests, server.answers = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client_for(url: str, retries: int = 3, **fields: Any) -> ChatClient:
    config = AgentConfig(base_url=url, model="policy", task="t", api_key="episode-token", retries=retries, **fields)
    return ChatClient(config)


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin_agent.time, "sleep", lambda seconds: None)


def test_a_completion_is_posted_under_the_base_url_with_the_token_the_tools_and_the_options(backend: Any) -> None:
    backend.answers = [(200, COMPLETION)]
    url = f"http://127.0.0.1:{backend.server_port}/v1/"
    messages = [{"role": "user", "content": "é"}]

    payload = client_for(url, temperature=0.5, max_tokens=7, extra_body={"seed": 3}).complete(messages)

    assert payload == COMPLETION
    [request] = backend.requests
    assert (request["path"], request["headers"]["Authorization"]) == ("/v1/chat/completions", "Bearer episode-token")
    assert request["headers"]["Host"] == f"127.0.0.1:{backend.server_port}"
    assert request["body"] == {"model": "policy", "messages": messages, "tools": TOOLS, "tool_choice": "auto",
                               "seed": 3, "temperature": 0.5, "max_tokens": 7}  # fmt: skip


def test_busy_answers_are_retried_and_other_errors_are_not(backend: Any) -> None:
    backend.answers = [(503, {"error": "busy"}), (429, {"error": "slow down"}), (200, COMPLETION)]
    url = f"http://127.0.0.1:{backend.server_port}/v1"
    assert client_for(url).complete([]) == COMPLETION
    backend.answers = [(404, {"error": "no route"})]
    with pytest.raises(ModelError, match='^model API answered 404: {"error": "no route"}$'):
        client_for(url).complete([])
    backend.answers = [(200, {"choices": []})]
    with pytest.raises(ModelError, match="^not a chat completion"):
        client_for(url).complete([])
    assert len(backend.requests) == 5


def free_port() -> int:
    """A loopback port nothing listens on (right now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_api_is_retried_then_reported() -> None:
    with pytest.raises(ModelError, match=r"^model API unreachable: ConnectionRefusedError"):
        client_for(f"http://127.0.0.1:{free_port()}/v1", retries=2).complete([])
    with pytest.raises(ModelError, match=r"^model API unreachable: TransportError\(\"not an http\(s\) base URL: 'ftp:"):
        client_for("ftp://127.0.0.1/v1", retries=0).complete([])


def test_httpx_responses_still_read_as_completions() -> None:
    """``_completion`` takes any response with ``json()`` and ``text`` (the recipes' agents pass httpx's)."""
    assert builtin_agent._completion(HttpResponse(200, json.dumps(COMPLETION).encode())) == COMPLETION


def test_start_up_and_a_model_call_import_only_the_standard_library_it_needs(tmp_path: Path) -> None:
    task = tmp_path / "task.md"
    task.write_text("Say hi.")
    agent = Path(builtin_agent.__file__)
    url, trajectory = f"http://127.0.0.1:{free_port()}/v1", str(tmp_path / "t.jsonl")
    argv = [sys.executable, "-I", "-S", "-X", "importtime", str(agent), "--base-url", url, "--model", "m",
            "--task-file", str(task), "--retries", "0", "--trajectory", trajectory]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    imported = {
        line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert result.returncode == 1, result.stderr[-2000:]  # nothing listens there: the model API is unreachable
    assert {"json", "socket", "subprocess"} <= imported
    assert sorted(imported & STARTUP_FORBIDDEN) == []
