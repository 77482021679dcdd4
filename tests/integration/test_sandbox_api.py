"""The sandbox REST API end to end: a real uvicorn server on loopback over the local runtime, driven by raw HTTP,
the sync and async SDK clients, and WebSockets for the PTY."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from orchard.env.api import create_sandbox_app
from orchard.env.client import AsyncSandboxClient, RemoteSandbox, SandboxClient
from orchard.env.exceptions import (
    InvalidSandboxRequestError,
    PathEscapeError,
    SandboxAuthError,
    SandboxExistsError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from orchard.env.local_runtime import LocalRuntime
from orchard.env.runtime import FileEntry, SandboxSpec

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
