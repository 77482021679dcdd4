"""The vLLM backend: an Orchard shim in front of a vLLM OpenAI server, with token traces and hot weight swaps.

The ``vllm`` backend of the engine interface (``orchard.engines.base.Engine``). ``orchard engine serve --backend vllm``
opens it with ``open_vllm``, which launches ``vllm serve`` (``VLLMServer``, or attaches to ``vllm.url``), and serves
Orchard's engine API in front of it (``create_vllm_app``):

- ``/v1/chat/completions`` and ``/v1/responses``, streamed or not: each request is checked as the local engine
  checks it, sent to vLLM's chat completions asking for token ids and logprobs, and answered with the ``orchard``
  trace and the policy version it ran on (``orchard.engines.vllm_mapping``, ``orchard.engines.vllm_responses``);
- ``/v1/tokenize``: the prompt token ids of a chat body, from vLLM's own ``/tokenize`` (what the recording proxy's
  ``count_tokens`` asks);
- ``/v1/models`` and ``/healthz``.

Hot reload reuses ``orchard.engines.reload.PolicyReloader`` (follow ``policy-versions``, download, check every
file's sha256), with ``VLLMBackend.load_version`` as the engine's loading step:

1. the new files are compared with the served weights (tensor names and shapes, from the safetensors headers);
   a corrupt or incompatible version is refused here, before traffic pauses or any weight changes;
2. ``DrainGate.swap`` holds new requests back and waits for those in flight to finish, so every request runs on
   one version from start to end and its trace says which;
3. ``POST /collective_rpc {"method": "orchard_load_weights", "args": [dir]}`` loads the weights in every vLLM
   worker (``orchard.engines.vllm_worker``; the endpoint exists when vLLM runs with ``VLLM_SERVER_DEV_MODE=1``);
4. ``POST /reset_prefix_cache`` drops KV blocks computed with the old weights;
5. the version is bumped and the held requests go on.

If step 3 or 4 fails, the weights in vLLM are no longer known to be one version: the shim answers 503
(``engine_unavailable``) until a later version loads, rather than record tokens under a wrong version.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.engines.base import Engine
from orchard.engines.drain_gate import DrainGate
from orchard.engines.exceptions import (
    CheckpointError,
    EngineError,
    EngineOverloadedError,
    GenerationFailedError,
    InvalidRequestError,
    ModelNotFoundError,
)
from orchard.engines.openai_common import engine_error_response, model_list
from orchard.engines.openai_common import error_response as openai_error
from orchard.engines.openai_requests import Flavour, PromptRequest, chat_request, parse_body, responses_request
from orchard.engines.vllm_mapping import ChatStreamMapper, VLLMProtocolError, chat_completion, vllm_chat_body
from orchard.engines.vllm_mapping import vllm_error_message as error_message
from orchard.engines.vllm_responses import ResponseStreamMapper, response_from_chat
from orchard.engines.vllm_worker import DIGEST_METHOD, LOAD_METHOD, WORKER_EXTENSION
from orchard.engines.weights_signature import WeightsSignature, check_compatible, read_config, signature
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.engines.config import EngineConfig
    from orchard.engines.reload import PolicyReloader

log = get_logger("engines.vllm")
T = TypeVar("T")

CONTEXT_HINTS = ("maximum context length", "context length", "max_model_len", "too long")
HEALTH_POLL_S = 1.0


class BackendUnavailableError(EngineError):
    """vLLM cannot be reached, or its weights are in an unknown state after a failed swap (HTTP 503)."""


class ReloadUnsupportedError(BackendUnavailableError):
    """vLLM has no ``/collective_rpc`` (not started with ``VLLM_SERVER_DEV_MODE=1``); its weights are untouched."""


# ---------------------------------------------------------------------------------------------------- launching
def vllm_command(config: EngineConfig, model: str, port: int, served_name: str) -> list[str]:
    """The ``vllm serve`` command line for ``config`` (``model``: a path or a Hugging Face id)."""
    v = config.vllm
    command = [
        v.executable, "serve", model, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", served_name, "--dtype", config.dtype,
        "--gpu-memory-utilization", str(v.gpu_memory_utilization),
        "--tensor-parallel-size", str(v.tensor_parallel_size),
        "--worker-extension-cls", WORKER_EXTENSION,
        # sample with the request's parameters only, as the local engine does (no generation_config.json defaults)
        "--generation-config", "vllm",
    ]  # fmt: skip
    if config.max_context is not None:
        command += ["--max-model-len", str(config.max_context)]
    if v.tool_call_parser is not None:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
    return command + list(v.extra_args)


def vllm_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launched server's environment: dev mode on, for ``/collective_rpc`` and ``/reset_prefix_cache``."""
    return dict(os.environ if base is None else base) | {"VLLM_SERVER_DEV_MODE": "1"}


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class VLLMServer:
    """A ``vllm serve`` subprocess; ``start`` returns once its ``/health`` answers 200."""

    def __init__(self, command: list[str], port: int, *, env: Mapping[str, str] | None = None) -> None:
        self.command = command
        self.port = port
        self.env = vllm_environment(env)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:port``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float) -> VLLMServer:
        """Launch and wait for health; ``BackendUnavailableError`` if it exits or stays unhealthy."""
        log.info("launching vLLM", command=" ".join(self.command))
        self.process = subprocess.Popen(self.command, env=self.env)  # noqa: S603 - our own command line
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BackendUnavailableError(f"vLLM exited with status {self.process.returncode} while starting")
            try:
                if httpx.get(f"{self.url}/health", timeout=5.0).status_code == 200:
                    log.info("vLLM is healthy", url=self.url, seconds=round(timeout_s - deadline + time.monotonic(), 1))
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
        self.stop()
        raise BackendUnavailableError(f"vLLM did not become healthy within {timeout_s:g} s (vllm.startup_timeout_s)")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Terminate (then kill) the server."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout_s)


# ---------------------------------------------------------------------------------------------------- the backend
class VLLMBackend(Engine):
    """The shim's state: the vLLM client, the version gate, and the weight-swap orchestration."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        served_name: str | None = None,
        vllm_model: str | None = None,
        policy_version: int = 0,
        default_max_tokens: int | None = None,
        parse_tools: bool = True,
        reference_dir: Path | None = None,
        drain_timeout_s: float = 300.0,
        reload_timeout_s: float = 600.0,
        max_waiting: int | None = None,
    ) -> None:
        self.client = client
        self.served_name = served_name or ""
        self.vllm_model = vllm_model
        self.max_model_len: int | None = None
        self.gate = DrainGate(policy_version, max_waiting=max_waiting)
        self.default_max_tokens = default_max_tokens
        self.parse_tools = parse_tools
        self.drain_timeout_s = drain_timeout_s
        self.reload_timeout_s = reload_timeout_s
        self.broken: str | None = None
        self.server: VLLMServer | None = None  # the vLLM Orchard launched for this backend; ``close`` stops it
        self._reference: WeightsSignature | None = None
        self._reference_config: dict[str, Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if reference_dir is not None and any(Path(reference_dir).glob("*.safetensors")):
            self._reference, self._reference_config = signature(reference_dir), read_config(reference_dir)

    @property
    def policy_version(self) -> int:
        """The version new requests run on (read by the reloader's thread too)."""
        return self.gate.version

    @property
    def model_name(self) -> str:
        """The model id of Orchard's API."""
        return self.served_name

    def create_app(self, reloader: PolicyReloader | None = None) -> FastAPI:
        """The shim's app (``create_vllm_app``)."""
        return create_vllm_app(self, reloader=reloader)

    def close(self) -> None:
        """Stop the vLLM server Orchard launched, if any (the app's lifespan closes the client)."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def start(self) -> None:
        """Bind to the running loop and learn vLLM's model id and context length from ``/v1/models``."""
        self._loop = asyncio.get_running_loop()
        response = await self.client.get("/v1/models")
        response.raise_for_status()
        entries = response.json().get("data") or []
        entry = next((e for e in entries if e.get("id") == self.vllm_model), entries[0] if entries else None)
        if entry is None:
            raise BackendUnavailableError("vLLM serves no model (/v1/models is empty)")
        self.vllm_model = str(entry["id"])
        self.served_name = self.served_name or self.vllm_model
        self.max_model_len = entry.get("max_model_len")

    # ------------------------------------------------------------------------------------------------ requests
    def prepare(self, raw: bytes, flavour: Flavour) -> tuple[PromptRequest, dict[str, Any]]:
        """Check a request body as the local engine does; return it and the vLLM body to send."""
        if self.broken is not None:
            raise BackendUnavailableError(f"the engine's weights are in an unknown state: {self.broken}")
        body = parse_body(raw)
        model = body.get("model")
        if isinstance(model, str) and model and model != self.served_name:
            message = f"the model {model!r} does not exist; this engine serves {self.served_name!r}"
            raise ModelNotFoundError(message, "model")
        request = chat_request(body) if flavour == "chat" else responses_request(body)
        vllm_body = vllm_chat_body(
            request, self.vllm_model or self.served_name, default_max_tokens=self.default_max_tokens,
            parse_tools=self.parse_tools,
        )  # fmt: skip
        return request, vllm_body

    async def complete(self, request: PromptRequest, vllm_body: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed answer, mapped, on the version the gate admitted it on."""
        async with self.gate.serving() as version:
            response = await self._post("/v1/chat/completions", vllm_body)
            if response.status_code != 200:
                raise backend_error(response.status_code, _json(response.content))
        try:
            raw = response.json()
        except ValueError as exc:
            raise VLLMProtocolError(f"vLLM answered with a body that is not JSON: {exc}") from exc
        if request.flavour == "chat":
            return chat_completion(raw, request, version)
        return response_from_chat(raw, request, version)

    async def open_stream(self, request: PromptRequest, vllm_body: dict[str, Any]) -> AsyncIterator[bytes]:
        """Start a streamed answer (errors before the first byte raise here); return its server-sent events."""
        version = await self.gate.enter()
        try:
            upstream = await self.client.send(
                self.client.build_request("POST", "/v1/chat/completions", json=vllm_body), stream=True
            )
        except httpx.HTTPError as exc:
            self.gate.leave()
            raise BackendUnavailableError(f"vLLM cannot be reached: {exc}") from exc
        except BaseException:
            self.gate.leave()
            raise
        if upstream.status_code != 200:
            content = await upstream.aread()
            await upstream.aclose()
            self.gate.leave()
            raise backend_error(upstream.status_code, _json(content))
        return self._relay(upstream, request, version)

    async def _relay(self, upstream: httpx.Response, request: PromptRequest, version: int) -> AsyncIterator[bytes]:
        chat = request.flavour == "chat"
        mapper: ChatStreamMapper | ResponseStreamMapper = (
            ChatStreamMapper(request, version) if chat else ResponseStreamMapper(request, version)
        )
        frame: Callable[[int, dict[str, Any]], bytes] = _chat_frame if chat else _responses_frame
        sequence = 0
        try:
            async for data in _sse_data(upstream):
                for event in mapper.push(json.loads(data)):
                    yield frame(sequence, event)
                    sequence += 1
            for event in mapper.finish():
                yield frame(sequence, event)
                sequence += 1
        except (GenerationFailedError, httpx.HTTPError, ValueError) as exc:
            log.warning("streamed answer failed", error=str(exc), policy_version=version)
            error = {"message": str(exc), "type": "server_error", "param": None, "code": "generation_failed"}
            yield frame(sequence, {"error": error} if chat else {"type": "error", **error})
        finally:
            await upstream.aclose()
            self.gate.leave()
        if chat:
            yield b"data: [DONE]\n\n"

    async def tokenize(self, raw: bytes) -> dict[str, Any]:
        """The prompt token ids a chat body renders to, from vLLM's ``/tokenize`` (nothing is generated)."""
        _, vllm_body = self.prepare(raw, "chat")
        body = {key: vllm_body[key] for key in ("model", "messages", "tools") if key in vllm_body}
        response = await self._post("/tokenize", body | {"add_generation_prompt": True})
        answer = _json(response.content)
        if response.status_code != 200:
            raise backend_error(response.status_code, answer)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise VLLMProtocolError("vLLM's /tokenize answer has no tokens")
        return {"count": len(tokens), "max_model_len": answer.get("max_model_len"), "tokens": tokens}

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> httpx.Response:
        try:
            timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
            return await self.client.post(path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise BackendUnavailableError(f"vLLM cannot be reached: {exc}") from exc

    # ------------------------------------------------------------------------------------------------ weights
    async def swap(self, directory: Path, version: int) -> float:
        """Load ``directory`` as ``version`` between requests (see the module docstring); return seconds closed."""
        if version <= self.gate.version:
            raise CheckpointError(f"version {version} is not newer than the version served ({self.gate.version})")
        reference = self._reference
        if reference is not None:
            check_compatible(directory, reference, self._reference_config)
        else:
            signature(directory)  # headers readable and consistent with the file sizes
        seconds = await self.gate.swap(version, lambda: self._load(directory), drain_timeout_s=self.drain_timeout_s)
        if reference is None:
            self._reference, self._reference_config = signature(directory), read_config(directory)
        log.info("vLLM serves a new policy version", version=version, closed_s=round(seconds, 3))
        return seconds

    async def _load(self, directory: Path) -> None:
        rpc = {"method": LOAD_METHOD, "args": [str(Path(directory).resolve())], "timeout": self.reload_timeout_s}
        try:
            response = await self._post("/collective_rpc", rpc, timeout_s=self.reload_timeout_s + 30)
            results = _rpc_results(response)
            reset = await self._post("/reset_prefix_cache", {})
            if reset.status_code != 200:
                raise BackendUnavailableError(f"vLLM refused to reset its prefix cache: HTTP {reset.status_code}")
        except ReloadUnsupportedError:
            raise  # nothing was loaded: the served version is intact
        except Exception as exc:
            self.broken = f"loading {directory} failed: {exc}"
            raise
        self.broken = None
        log.info("weights loaded in every vLLM worker", workers=len(results), tensors=results[0].get("tensors"))

    def load_version(self, directory: Path, version: int) -> None:
        """The reloader's loading step (called from its thread): swap on the serving loop and wait for it."""
        self.run_blocking(self.swap(Path(directory), version), self.drain_timeout_s + self.reload_timeout_s + 120)

    def run_blocking(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` on the serving loop from another thread and wait for its result."""
        if self._loop is None:
            coroutine.close()
            raise BackendUnavailableError("the vLLM backend has not started")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def weights_digest(self) -> list[Any]:
        """Each worker's fingerprint of the served weights (for checks that a swap took effect)."""
        return _rpc_results(await self._post("/collective_rpc", {"method": DIGEST_METHOD}))

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` reports."""
        return {
            "status": "ok" if self.broken is None else "unavailable",
            "backend": "vllm",
            "model": self.served_name,
            "vllm_model": self.vllm_model,
            "policy_version": self.gate.version,
            "in_flight": self.gate.in_flight,
            "waiting": self.gate.waiting,
            "swapping": self.gate.swapping,
            "broken": self.broken,
        }


def _rpc_results(response: httpx.Response) -> list[Any]:
    if response.status_code == 404:
        raise ReloadUnsupportedError("vLLM has no /collective_rpc: start it with VLLM_SERVER_DEV_MODE=1")
    if response.status_code != 200:
        raise CheckpointError(f"vLLM failed to load the weights: HTTP {response.status_code} {response.text[:500]}")
    results = response.json().get("results") if response.content else None
    if not isinstance(results, list) or not results:
        raise CheckpointError(f"vLLM's workers returned no result: {response.text[:200]!r}")
    return results


def backend_error(status: int, payload: Any) -> EngineError:
    """The Orchard error for a vLLM error answer."""
    message = error_message(payload)
    if status == 400:
        if any(hint in message.lower() for hint in CONTEXT_HINTS):
            return InvalidRequestError(message, "messages", code="context_length_exceeded")
        return InvalidRequestError(message)
    if status in (429, 503):
        return EngineOverloadedError(f"vLLM is overloaded: {message}")
    return VLLMProtocolError(f"vLLM answered HTTP {status}: {message}")


def _json(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content.decode(errors="replace")


async def _sse_data(upstream: httpx.Response) -> AsyncIterator[str]:
    async for line in upstream.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data
    raise VLLMProtocolError("vLLM's stream ended without [DONE]")


def _chat_frame(_: int, event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


def _responses_frame(sequence: int, event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event | {'sequence_number': sequence})}\n\n".encode()


# ---------------------------------------------------------------------------------------------------- the app
def error_response(exc: EngineError) -> JSONResponse:
    """An OpenAI error object for an engine error (same codes as the local engine, plus 502 for vLLM faults)."""
    if isinstance(exc, VLLMProtocolError):
        return openai_error(502, str(exc), "backend_error")
    return engine_error_response(exc)


def create_vllm_app(backend: VLLMBackend, *, reloader: PolicyReloader | None = None) -> FastAPI:
    """The shim's FastAPI app; its lifespan binds the backend to the loop and runs the reloader."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await backend.start()
        if reloader is not None:
            reloader.start()
        try:
            yield
        finally:
            if reloader is not None:
                await asyncio.to_thread(reloader.stop)
            await backend.client.aclose()

    app = FastAPI(title="Orchard vLLM engine", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    async def answer(request: Request, flavour: Flavour) -> Response:
        try:
            prompt_request, vllm_body = backend.prepare(await request.body(), flavour)
            if prompt_request.stream:
                events = await backend.open_stream(prompt_request, vllm_body)
                return StreamingResponse(events, media_type="text/event-stream")
            return JSONResponse(await backend.complete(prompt_request, vllm_body))
        except EngineError as exc:
            return error_response(exc)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, "chat")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await answer(request, "responses")

    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            return JSONResponse(await backend.tokenize(await request.body()))
        except EngineError as exc:
            return error_response(exc)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(backend.served_name, max_model_len=backend.max_model_len)

    @app.get("/healthz")
    async def healthz() -> Response:
        health = backend.health()
        if reloader is not None:
            health["reloads"] = [
                {"version": e.version, "applied": e.applied, "seconds": round(e.seconds, 4), "reason": e.reason}
                for e in reloader.events[-20:]
            ]
        return JSONResponse(health, status_code=200 if backend.broken is None else 503)

    return app


# ---------------------------------------------------------------------------------------------------- serving
def build_backend(config: EngineConfig, url: str, reference_dir: Path | None) -> VLLMBackend:
    """A backend on ``url`` configured by ``config``."""
    v = config.vllm
    timeout = httpx.Timeout(v.request_timeout_s, connect=10.0)
    client = httpx.AsyncClient(base_url=url, timeout=timeout, limits=httpx.Limits(max_connections=None))
    launched = v.url is None
    served = config.served_model_name or (Path(config.model).name if launched else None)
    return VLLMBackend(
        client,
        served_name=served,
        vllm_model=served if launched else None,
        policy_version=config.policy_version,
        default_max_tokens=config.default_max_tokens,
        parse_tools=v.tool_call_parser is not None or not launched,
        reference_dir=reference_dir,
        drain_timeout_s=v.drain_timeout_s,
        reload_timeout_s=v.reload_timeout_s,
        max_waiting=config.max_queue,
    )


def resolve_vllm_model(config: EngineConfig) -> tuple[str, Path | None]:
    """What ``vllm serve`` gets (a tiny-family name is built into a checkpoint first) and its local directory."""
    from orchard.engines.tiny import ensure_tiny_checkpoint, is_tiny_name

    if is_tiny_name(config.model) and config.vllm.url is None:
        path = ensure_tiny_checkpoint(config.model, config.cache_dir, config.tiny_seed)
        return str(path), path
    path = Path(config.model)
    return config.model, path if path.is_dir() else None


def open_vllm(config: EngineConfig) -> VLLMBackend:
    """Launch vLLM (or attach to ``vllm.url``) and the backend in front of it; ``close()`` stops a launched vLLM."""
    model, local_dir = resolve_vllm_model(config)
    if config.vllm.url is not None:
        return build_backend(config, str(config.vllm.url).rstrip("/"), local_dir)
    served = config.served_model_name or Path(config.model).name
    port = config.vllm.port or free_port()
    server = VLLMServer(vllm_command(config, model, port, served), port).start(config.vllm.startup_timeout_s)
    try:
        backend = build_backend(config, server.url, local_dir)
    except BaseException:
        server.stop()
        raise
    backend.server = server
    return backend
