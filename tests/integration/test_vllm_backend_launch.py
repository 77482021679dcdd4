"""The vLLM backend as ``open_vllm`` runs it, with a stand-in for ``vllm serve`` (``fake_vllm.py``; no GPU):

- ``VLLMServer`` launches the command ``vllm_command`` builds, in dev mode, and waits for ``/health``;
- the shim serves chat (streamed and not) and responses with the trace, through real sockets;
- hot reload through ``PolicyReloader`` (embedded bus, local store, ``publish_policy_version``): a good version is
  loaded with ``collective_rpc`` and the prefix cache reset; a tampered one (sha256) and an incompatible one (a
  tensor missing) are refused without reaching vLLM, and the version served stays the good one;
- stopping the server ends the process; ``open_engine`` launches it and the engine's ``close()`` stops it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from safetensors.numpy import save_file

from orchard.artifacts import policy_artifact_name
from orchard.bus import open_bus
from orchard.config import EmbeddedBusConfig, LocalStoreConfig
from orchard.engines.config import EngineConfig
from orchard.engines.factory import open_engine
from orchard.engines.reload import PolicyReloader
from orchard.engines.token_trace import trace_of
from orchard.engines.vllm_backend import (
    BackendUnavailableError,
    VLLMBackend,
    VLLMServer,
    build_backend,
    create_vllm_app,
    free_port,
    vllm_command,
)
from orchard.http_server import BackgroundServer
from orchard.store import open_store
from trainers.weights import publish_policy_version

FAKE = Path(__file__).with_name("fake_vllm.py")
SHAPES = {"model.embed_tokens.weight": (16, 4), "model.norm.weight": (4,)}
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "Hello?"}]}


def checkpoint(directory: Path, shapes: dict[str, tuple[int, ...]], fill: float = 0.0) -> Path:
    directory.mkdir(parents=True)
    save_file({k: np.full(s, fill, dtype=np.float32) for k, s in shapes.items()}, directory / "model.safetensors")
    return directory


def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def launched(tmp_path: Path) -> tuple[EngineConfig, VLLMServer, Path]:
    wrapper = tmp_path / "vllm"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    base = checkpoint(tmp_path / "base", SHAPES)
    config = EngineConfig.model_validate(
        {"type": "vllm", "model": str(base), "served_model_name": "policy",
         "vllm": {"executable": str(wrapper), "startup_timeout_s": 60, "extra_args": ["--enforce-eager"]}}
    )  # fmt: skip
    port = free_port()
    return config, VLLMServer(vllm_command(config, str(base), port, "policy"), port), base


def test_launched_vllm_serves_through_the_shim_and_hot_reloads_only_verified_versions(
    tmp_path: Path, launched: tuple[EngineConfig, VLLMServer, Path]
) -> None:
    config, server, base = launched
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    store = open_store(LocalStoreConfig(path=tmp_path / "store"))
    producer = bus.producer()
    publish = {"run_id": "r1", "model": "policy", "trainer_step": 1}
    server.start(60)
    try:
        backend = build_backend(config, server.url, base)
        reloader = PolicyReloader(backend, bus, store, run_id="r1", model="policy", poll_timeout_s=0.1)
        with (
            BackgroundServer(create_vllm_app(backend, reloader=reloader)) as shim,
            httpx.Client(base_url=shim.url) as http,
        ):
            before = trace_of(http.post("/v1/chat/completions", json=CHAT).json())
            streamed = http.post("/v1/chat/completions", json=CHAT | {"stream": True}).text
            answered = http.post("/v1/responses", json={"model": "policy", "input": "Hello?"}).json()

            v1 = checkpoint(tmp_path / "v1", SHAPES, fill=1.0)
            publish_policy_version(
                store, producer, version=1, files={"model.safetensors": v1 / "model.safetensors"}, **publish
            )
            until(lambda: reloader.applied == [1])

            v2 = checkpoint(tmp_path / "v2", SHAPES, fill=2.0)
            held = _Held()
            publish_policy_version(
                store, held, version=2, files={"model.safetensors": v2 / "model.safetensors"}, **publish
            )
            stored = tmp_path / "store" / policy_artifact_name("r1", "policy") / "v0000000002" / "model.safetensors"
            data = bytearray(stored.read_bytes())
            data[-1] ^= 0xFF
            stored.write_bytes(bytes(data))
            for topic, value, key in held.sent:
                producer.send(topic, value, key)
            until(lambda: reloader.refused == [2])

            v3 = checkpoint(tmp_path / "v3", {"model.norm.weight": (4,)}, fill=3.0)
            publish_policy_version(
                store, producer, version=3, files={"model.safetensors": v3 / "model.safetensors"}, **publish
            )
            until(lambda: reloader.refused == [2, 3])

            after = trace_of(http.post("/v1/chat/completions", json=CHAT).json())
            health = http.get("/healthz").json()
            fake_log = httpx.get(f"{server.url}/fake/log").json()
        reloader_reasons = [e.reason for e in reloader.events]
    finally:
        server.stop()
        producer.close()
        bus.close()
        store.close()

    assert before is not None and after is not None
    assert (before.policy_version, after.policy_version, health["policy_version"]) == (0, 1, 1)
    assert streamed.endswith("data: [DONE]\n\n") and '"orchard"' in streamed
    assert trace_of(answered).completion_token_ids == before.completion_token_ids  # type: ignore[union-attr]
    assert "sha256" in reloader_reasons[1] and "miss" in reloader_reasons[2]
    argv = fake_log[0]["argv"]
    assert argv[argv.index("--worker-extension-cls") + 1] == "orchard.engines.vllm_worker.OrchardWorkerExtension"
    rpcs = [entry for entry in fake_log if "rpc" in entry or "reset" in entry]
    assert [next(iter(e)) for e in rpcs] == ["rpc", "reset"]  # only the verified version reached vLLM
    assert rpcs[0]["rpc"]["method"] == "orchard_load_weights"
    assert server.process is not None and server.process.poll() is not None


def test_open_engine_launches_vllm_and_close_stops_it(launched: tuple[EngineConfig, VLLMServer, Path]) -> None:
    config, _, _ = launched
    engine = open_engine(config)
    assert isinstance(engine, VLLMBackend) and engine.server is not None
    process = engine.server.process
    assert process is not None and process.poll() is None and engine.model_name == "policy"
    engine.close()
    assert (process.poll() is not None, engine.server) == (True, None)
    asyncio.run(engine.client.aclose())


def test_a_vllm_that_exits_while_starting_is_reported(tmp_path: Path) -> None:
    failing = tmp_path / "vllm"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    with pytest.raises(BackendUnavailableError, match="exited with status 3"):
        VLLMServer([str(failing), "serve", "m"], free_port()).start(30)


class _Held:
    """Keeps a ``PolicyVersion`` record back, to tamper with the store before it is announced."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append((topic, value, key))
