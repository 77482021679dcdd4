"""The sandbox REST API end to end: a real uvicorn server on loopback over the local runtime, driven by raw HTTP,
the sync and async SDK clients, and WebSockets for the PTY."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from orchard.sandbox import FileEntry, Sandbox, SandboxSpec
from orchard.sandbox.api import create_sandbox_app
from orchard.sandbox.client import AsyncSandboxClient, RemoteSandbox, SandboxClient
from orchard.sandbox.exceptions import (
    InvalidSandboxRequestError,
    PathEscapeError,
    SandboxAuthError,
    SandboxExistsError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from orchard.sandbox.local.runtime import LocalRuntime

TOKEN = "test-token-0123456789"  # noqa: S105 - a test credential


def spec(sandbox_id: str, **fields: object) -> SandboxSpec:
    """A spec with test identities."""
    return SandboxSpec(sandbox_id=sandbox_id, run_id="run-api", episode_id=f"ep-{sandbox_id}", task_id="t", **fields)


class ServerThread:
    """A uvicorn server on a free loopback port, in a background thread."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", ws="websockets-sansio", timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuntime]:
    """One local runtime for the module."""
    rt = LocalRuntime(tmp_path_factory.mktemp("api") / "sandboxes")
    try:
        yield rt
    finally:
        rt.close()


@pytest.fixture(scope="module")
def server(runtime: LocalRuntime) -> Iterator[str]:
    """The API over ``runtime`` (reaping every 0.2 s); yields its base URL."""
    with ServerThread(create_sandbox_app(runtime, TOKEN, reap_interval_s=0.2)) as running:
        yield running.url


@pytest.fixture
def client(server: str) -> Iterator[SandboxClient]:
    """A sync SDK client."""
    with SandboxClient(server, TOKEN) as sdk:
        yield sdk


@pytest.fixture
def remote(client: SandboxClient, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RemoteSandbox]:
    """A sandbox (with one file) created through the API, deleted afterwards."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "hello.txt").write_text("hello\n")
    name = request.node.name.replace("_", "-").lower()[-40:].strip("-")
    sandbox = client.create(spec(name, source_dir=source))
    try:
        yield sandbox
    finally:
        sandbox.close()


def test_every_route_but_healthz_needs_the_token(server: str, client: SandboxClient) -> None:
    assert httpx.get(f"{server}/healthz").json() == {"status": "ok"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = httpx.get(f"{server}/sandboxes", headers=headers)
        assert (response.status_code, response.json()["error"]) == (401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.post(f"{server}/sandboxes/x/exec", json={"command": "true"}).status_code == 401
    with SandboxClient(server, "wrong") as intruder, pytest.raises(SandboxAuthError):
        intruder.list()


def test_sandbox_lifecycle_and_errors(client: SandboxClient, server: str) -> None:
    created = client.create(spec("life", ttl_s=100))
    info = created.info()
    assert info.spec.sandbox_id == "life" and info.workdir is not None and info.expires_at is not None
    assert [i.spec.sandbox_id for i in client.list()] == ["life"]
    with pytest.raises(SandboxExistsError):
        client.create(spec("life"))
    before = info.expires_at
    time.sleep(0.05)
    created.heartbeat()
    assert created.info().expires_at > before
    client.delete("life")
    with pytest.raises(SandboxNotFoundError):
        client.get("life")
    with pytest.raises(SandboxNotFoundError):
        client.delete("life")
    created.close()  # idempotent
    bad = httpx.post(f"{server}/sandboxes", json={"sandbox_id": "Bad_Id"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (bad.status_code, bad.json()["error"]) == (422, "invalid_request")
    missing = httpx.get(f"{server}/sandboxes/nope", headers={"Authorization": f"Bearer {TOKEN}"})
    assert missing.json() == {"error": "sandbox_not_found", "message": "no sandbox 'nope'"}


def test_exec_json_and_ndjson_stream(remote: RemoteSandbox, server: str) -> None:
    result = remote.exec("cat hello.txt; echo oops >&2; exit 2")
    assert (result.exit_code, result.stdout, result.stderr) == (2, "hello\n", "oops\n")
    assert remote.exec(["cat"], stdin=b"piped").stdout == "piped"
    assert remote.exec("sleep 10", timeout_s=0.3).timed_out
    headers = {"Authorization": f"Bearer {TOKEN}"}
    body = {"command": "echo a; sleep 0.05; echo b >&2; exit 1"}
    raw = httpx.post(f"{server}{remote.url}/exec", params={"stream": "true"}, json=body, headers=headers)
    assert raw.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in raw.text.splitlines()]
    assert lines[:2] == [{"stream": "stdout", "data": "a\n"}, {"stream": "stderr", "data": "b\n"}]
    assert (lines[2]["stream"], lines[2]["exit_code"], lines[2]["timed_out"], len(lines)) == ("exit", 1, False, 3)
    assert list(remote.exec_stream("echo x; exit 3")) == [("stdout", b"x\n"), ("exit", 3)]
    with pytest.raises(PathEscapeError):
        list(remote.exec_stream("pwd", cwd="../.."))


def test_files_and_path_escapes(remote: RemoteSandbox) -> None:
    remote.write_file("dir/data.bin", bytes(range(256)), mode=0o640)
    assert remote.read_file("dir/data.bin") == bytes(range(256))
    assert remote.exec("stat -c %a dir/data.bin").stdout == "640\n"
    assert remote.list_files("dir") == [FileEntry(path="dir/data.bin", kind="file", size=256)]
    assert [e.path for e in remote.list_files(".", recursive=True)] == ["dir", "dir/data.bin", "hello.txt"]
    remote.exec("ln -s /etc/passwd outer")
    for path in ("../../../etc/passwd", "/etc/passwd", "outer", "dir/../../x"):
        with pytest.raises(PathEscapeError):
            remote.read_file(path)
    with pytest.raises(PathEscapeError):
        remote.write_file("../escape.txt", b"x")
    with pytest.raises(SandboxFileNotFoundError):
        remote.read_file("missing")
    with pytest.raises(InvalidSandboxRequestError):
        remote.read_file("dir")
    remote.delete_file("dir")
    assert [e.path for e in remote.list_files()] == ["hello.txt", "outer"]


def test_apply_patch_over_rest(remote: RemoteSandbox) -> None:
    patch = "--- a/hello.txt\n+++ b/hello.txt\n@@ -1 +1 @@\n-hello\n+patched\n"
    assert remote.apply_patch(patch).exit_code == 0
    assert remote.read_file("hello.txt") == b"patched\n"
    assert remote.apply_patch("not a patch").exit_code != 0


def test_ttl_reaper_runs_in_the_service(client: SandboxClient) -> None:
    client.create(spec("ephemeral", ttl_s=0.3))
    deadline = time.monotonic() + 5
    while any(i.spec.sandbox_id == "ephemeral" for i in client.list()):
        assert time.monotonic() < deadline, "the reaper did not delete the sandbox"
        time.sleep(0.05)


def test_pty_over_websocket_with_the_sync_client(remote: RemoteSandbox) -> None:
    terminal = remote.open_pty(cols=90, rows=20)
    try:
        terminal.write(b"stty size; echo hi\n")
        seen = b""
        deadline = time.monotonic() + 10
        while b"20 90\r\nhi\r\n" not in seen and time.monotonic() < deadline:  # the output, not the echoed input
            seen += terminal.read(timeout_s=0.5) or b""
        assert b"20 90\r\nhi\r\n" in seen
        terminal.resize(120, 40)
        terminal.write(b"stty size\n")
        while b"40 120" not in seen and time.monotonic() < deadline:
            seen += terminal.read(timeout_s=0.5) or b""
        assert b"40 120" in seen
        terminal.write(b"exit 7\n")
        assert terminal.wait(10) == 7
    finally:
        terminal.close()


def test_pty_refuses_a_wrong_token_and_an_unknown_sandbox(server: str, client: SandboxClient) -> None:
    sandbox = client.create(spec("pty-refusals"))
    try:
        with SandboxClient(server, "wrong") as intruder, pytest.raises(SandboxAuthError):
            RemoteSandbox(intruder, sandbox.info()).open_pty()
    finally:
        sandbox.close()
    with pytest.raises(SandboxNotFoundError):
        sandbox.open_pty()


@pytest.mark.asyncio
async def test_async_client_end_to_end_with_pty(server: str, tmp_path: Path) -> None:
    async with AsyncSandboxClient(server, TOKEN) as sdk:
        assert await sdk.healthz()
        sandbox = await sdk.create(spec("async-one"))
        try:
            await sandbox.write_file("a.txt", b"async\n")
            assert await sandbox.read_file("a.txt") == b"async\n"
            assert (await sandbox.exec(["cat", "a.txt"])).stdout == "async\n"
            assert [item async for item in sandbox.exec_stream("echo s")] == [("stdout", b"s\n"), ("exit", 0)]
            assert [e.path for e in await sandbox.list_files()] == ["a.txt"]
            assert (await sandbox.apply_patch("--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-async\n+b\n")).exit_code == 0
            await sandbox.heartbeat()
            with pytest.raises(PathEscapeError):
                await sandbox.read_file("../x")
            terminal = await sandbox.open_pty("sh")
            await terminal.write(b"echo hi-$((40 + 2))\nexit 3\n")
            seen = b""
            while chunk := await asyncio.wait_for(terminal.read(), 10):
                seen += chunk
            assert b"hi-42\r\n" in seen and terminal.exit_code == 3
            await terminal.close()
            await sandbox.delete_file("a.txt")
        finally:
            await sandbox.close()
        with pytest.raises(SandboxNotFoundError):
            await sdk.get("async-one")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_hundred_sandboxes_created_and_execd_concurrently(server: str) -> None:
    async with AsyncSandboxClient(server, TOKEN, timeout_s=120) as sdk:

        async def one(index: int) -> tuple[int | None, str]:
            sandbox = await sdk.create(spec(f"many-{index:03d}"))
            try:
                result = await sandbox.exec(f"echo {index}")
                return result.exit_code, result.stdout
            finally:
                await sandbox.close()

        results = await asyncio.gather(*(one(i) for i in range(100)))
        assert results == [(0, f"{i}\n") for i in range(100)]
        assert [i.spec.sandbox_id for i in await sdk.list() if i.spec.sandbox_id.startswith("many-")] == []


# ---------------------------------------------------------------------------------------------------- bad input
LONG = "a" * 256
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Bad:
    """A request the API must refuse: its method, path (under the sandbox, unless it starts with ``/``), JSON or raw
    body, and the status, error code and part of the message it must answer with."""

    method: str
    path: str
    status: int
    reason: str
    body: object = None
    raw: bytes | None = None
    code: str = "invalid_request"


BAD_INPUT = {
    # issue 15: a path component over 255 bytes, a NUL in an argument or an environment name, '=' in a name
    "long-name-write": Bad("PUT", f"files/{LONG}", 400, "256 bytes long; the limit is 255", raw=b""),
    "long-name-read": Bad("GET", f"files/dir/{LONG}", 400, "the limit is 255"),
    "long-name-delete": Bad("DELETE", f"files/{LONG}", 400, "the limit is 255"),
    "long-name-list": Bad("GET", f"files?path={LONG}", 400, "the limit is 255"),
    "long-name-cwd": Bad("POST", "exec", 400, "the limit is 255", {"command": "pwd", "cwd": LONG}),
    "nul-in-argument": Bad("POST", "exec", 422, "argument 1 contains a NUL byte",
                           {"command": ["echo", "a\0b"]}),
    "nul-in-shell-command": Bad("POST", "exec", 422, "the command contains a NUL byte",
                                {"command": "echo a\0b"}),
    "nul-in-env-name": Bad("POST", "exec", 422, "'A\\x00B' contains a NUL byte",
                           {"command": "true", "env": {"A\0B": "1"}}),
    "nul-in-env-value": Bad("POST", "exec", 422, "variable 'A' contains a NUL byte",
                            {"command": "true", "env": {"A": "1\0"}}),
    "equals-in-env-name": Bad("POST", "exec", 422, "'A=B' contains '='",
                              {"command": "true", "env": {"A=B": "1"}}),
    "empty-env-name": Bad("POST", "exec", 422, "name is empty", {"command": "true", "env": {"": "1"}}),
    "nul-in-stream-argument": Bad("POST", "exec?stream=true", 422, "contains a NUL byte",
                                  {"command": ["echo", "\0"]}),
    # beyond the issue
    "huge-path": Bad("PUT", "files/" + "/".join(["d" * 200] * 25), 400, "the limit is 4095", raw=b""),
    "dot-dot": Bad("GET", "files/%2E%2E/%2E%2E/etc/passwd", 400, "leaves the", code="path_escape"),
    "absolute": Bad("GET", "files?path=/etc", 400, "absolute path", code="path_escape"),
    "nul-in-path": Bad("GET", "files/a%00b", 400, "NUL byte"),
    "nul-in-cwd": Bad("POST", "exec", 422, "cwd contains a NUL byte", {"command": "pwd", "cwd": "\0"}),
    "non-utf8-path": Bad("PUT", "files/%FF%FE", 400, "not UTF-8", raw=b"x"),
    "non-utf8-query": Bad("GET", "files?path=%C3", 400, "not UTF-8"),
    "lone-surrogate-stdin": Bad("POST", "exec", 422, "stdin is not valid UTF-8",
                                raw=b'{"command": ["cat"], "stdin": "\\ud800"}'),
    "lone-surrogate-argument": Bad("POST", "exec", 422, "not valid UTF-8",
                                   raw=b'{"command": ["echo", "\\ud800"]}'),
    "non-utf8-body": Bad("POST", "exec", 422, "JSON decode error", raw=b"\xff\xfe"),
    "negative-timeout": Bad("POST", "exec", 422, "greater than 0", {"command": "true", "timeout_s": -1}),
    "huge-timeout": Bad("POST", "exec", 422, "less than or equal", {"command": "true", "timeout_s": 1e300}),
    "nan-timeout": Bad("POST", "exec", 422, "timeout_s", raw=b'{"command": "true", "timeout_s": NaN}'),
    "wrong-type": Bad("POST", "exec", 422, "body.command", {"command": 5}),
    "wrong-env-type": Bad("POST", "exec", 422, "valid dictionary", {"command": "true", "env": ["A"]}),
    "unknown-field": Bad("POST", "exec", 422, "body.shell: Extra inputs", {"command": "true", "shell": 1}),
    "over-long-env-value": Bad("POST", "exec", 422, "at most 131071 fit in one argument",
                               {"command": "true", "env": {"A": "x" * 200_000}}),
    "over-long-argument": Bad("POST", "exec", 422, "at most 131071", {"command": ["echo", "x" * 200_000]}),
    "too-many-arguments": Bad("POST", "exec", 422, "at most 1048576 fit",
                              {"command": ["echo", *(["x" * 1000] * 2000)]}),
    "empty-argv": Bad("POST", "exec", 400, "empty command", {"command": []}),
    "negative-mode": Bad("PUT", "files/m.txt?mode=-1", 400, "not a file mode", raw=b"x"),
    "huge-mode": Bad("PUT", "files/m.txt?mode=77777777777777777777", 400, "not a file mode", raw=b"x"),
    "patch-wrong-type": Bad("POST", "patch", 422, "valid string", {"patch": 1}),
    "spec-nul-in-env": Bad("POST", "/sandboxes", 400, "contains a NUL byte",
                           {**spec("bad-env").model_dump(mode="json"), "env": {"A\0": "1"}}),
    "spec-equals-in-env": Bad("POST", "/sandboxes", 400, "contains '='",
                              {**spec("bad-env").model_dump(mode="json"), "env": {"A=": "1"}}),
    "spec-long-source": Bad("POST", "/sandboxes", 400, "over 255 bytes",
                            {**spec("bad-src").model_dump(mode="json"), "source_dir": f"/{LONG}"}),
    "spec-port-out-of-range": Bad("POST", "/sandboxes", 400, "Port out of range",
                                  {**spec("bad-port").model_dump(mode="json"), "proxy_url": "http://127.0.0.1:99999"}),
    "non-utf8-sandbox-id": Bad("GET", "/sandboxes/%FF", 400, "not UTF-8"),
}  # fmt: skip


class KeepAlive:
    """One HTTP/1.1 connection kept open across requests (``http.client``); its socket changes if the server hung up."""

    def __init__(self, url: str) -> None:
        self.connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, Any, http.client.HTTPResponse]:
        """Status, JSON body and response of one request on the connection."""
        headers = {**self.headers, **JSON} if body is not None else self.headers
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        data = response.read()
        return response.status, json.loads(data) if data else None, response

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()


@pytest.fixture
def keep_alive(server: str) -> Iterator[KeepAlive]:
    """A kept-alive connection to the API."""
    connection = KeepAlive(server)
    yield connection
    connection.close()


def test_bad_input_is_a_4xx_with_the_reason_and_the_connection_stays_open(
    client: SandboxClient, keep_alive: KeepAlive
) -> None:
    sandbox = client.create(spec("bad-input"))
    try:
        keep_alive.request("GET", "/healthz")
        sock = keep_alive.connection.sock
        answers = {}
        for name, bad in BAD_INPUT.items():
            path = bad.path if bad.path.startswith("/") else f"{sandbox.url}/{bad.path}"
            body = bad.raw if bad.raw is not None else None if bad.body is None else json.dumps(bad.body).encode()
            status, reply, response = keep_alive.request(bad.method, path, body)
            answers[name] = (status, reply["error"], bad.reason in reply["message"], response.will_close)
            assert keep_alive.connection.sock is sock, f"{name}: the server closed the connection"
        expected = {name: (bad.status, bad.code, True, False) for name, bad in BAD_INPUT.items()}
        assert answers == expected
        assert [info.spec.sandbox_id for info in client.list()] == ["bad-input"]  # no bad spec made a sandbox
        assert sandbox.exec(["echo", "still", "fine"]).stdout == "still fine\n"
    finally:
        sandbox.close()


def test_the_sdk_refuses_what_the_server_would_refuse(remote: RemoteSandbox) -> None:
    for command, env in ((["echo", "a\0"], None), ("true", {"A=B": "1"})):
        with pytest.raises(InvalidSandboxRequestError):
            remote.exec(command, env=env)
    with pytest.raises(InvalidSandboxRequestError, match="the limit is 255"):
        remote.read_file(LONG)


class FaultyRuntime(LocalRuntime):
    """A local runtime whose ``list`` breaks while ``broken`` (a server fault, not the client's)."""

    broken = True

    def list(self) -> list[Sandbox]:
        if self.broken:
            raise RuntimeError("the runtime's bookkeeping is broken")
        return super().list()


def test_a_server_fault_is_a_logged_500_and_the_connection_stays_open(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    runtime = FaultyRuntime(tmp_path / "faulty")
    try:
        with ServerThread(create_sandbox_app(runtime, TOKEN, reap_interval_s=None)) as running:
            connection = KeepAlive(running.url)
            try:
                status, body, response = connection.request("GET", "/sandboxes")
                sock = connection.connection.sock
                assert (status, body, response.will_close) == (
                    500, {"error": "internal", "message": "RuntimeError: the runtime's bookkeeping is broken"}, False,
                )  # fmt: skip
                assert connection.request("GET", "/sandboxes/nope")[:2] == (
                    404, {"error": "sandbox_not_found", "message": "no sandbox 'nope'"},
                )  # fmt: skip
                assert connection.connection.sock is sock
            finally:
                connection.close()
    finally:
        runtime.broken = False
        runtime.close()
    logged = capfd.readouterr()
    assert "sandbox_api_error" in logged.out + logged.err
    assert "Traceback" in logged.out + logged.err and "bookkeeping is broken" in logged.out + logged.err
