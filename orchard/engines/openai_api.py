"""The engine's OpenAI-compatible HTTP API: ``/v1/chat/completions``, ``/v1/responses``, ``/v1/models``, ``/healthz``.

``create_engine_app(engine)`` wraps a ``LocalEngine`` (its lifespan starts and stops the engine's worker, and the
policy reloader when one is given). Each request is checked (``openai_requests``), rendered by the model's chat
template, queued on the scheduler and answered (``openai_output``), streamed as server-sent events when asked.
Errors are OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}``:

=====================================  ======  ===========================
problem                                status  code
=====================================  ======  ===========================
malformed body, messages, tools        400     ``invalid_request``
prompt + max_tokens over the context   400     ``context_length_exceeded``
unknown model                          404     ``model_not_found``
request queue full                     503     ``engine_overloaded`` (with ``Retry-After``)
generation failed in the worker        500     ``generation_failed``
=====================================  ======  ===========================
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.engines.batching import GenerationHandle
from orchard.engines.exceptions import (
    EngineError,
    EngineOverloadedError,
    GenerationFailedError,
    InvalidRequestError,
    ModelNotFoundError,
)
from orchard.engines.openai_output import Answer, Reply, chat_chunks, chat_completion, response_events, response_object
from orchard.engines.openai_requests import Flavour, PromptRequest, chat_request, parse_body, responses_request
from orchard.engines.sampling import SamplingParams
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.engines.local import LocalEngine
    from orchard.engines.reload import PolicyReloader

log = get_logger("engines.api")

RETRY_AFTER_S = 1


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """An OpenAI error object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    error = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def _engine_error(exc: EngineError) -> JSONResponse:
    if isinstance(exc, InvalidRequestError):
        return error_response(exc.status, str(exc), exc.code, exc.param)
    if isinstance(exc, EngineOverloadedError):
        return error_response(503, str(exc), "engine_overloaded")
    if isinstance(exc, GenerationFailedError):
        return error_response(500, str(exc), "generation_failed")
    return error_response(503, str(exc), "engine_unavailable")


def create_engine_app(engine: LocalEngine, *, reloader: PolicyReloader | None = None) -> FastAPI:
    """The FastAPI app serving ``engine``; running it starts the engine (and ``reloader``), stopping it stops them."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        if reloader is not None:
            reloader.start()
        try:
            yield
        finally:
            if reloader is not None:
                await asyncio.to_thread(reloader.stop)
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="Orchard local engine", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _answer(engine, request, "chat")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await _answer(engine, request, "responses")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": engine.model_name, "object": "model", "created": 0, "owned_by": "orchard"}
        return {"object": "list", "data": [entry | {"max_model_len": engine.max_context}]}

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        scheduler = engine.scheduler
        health = {
            "status": "ok",
            "model": engine.model_name,
            "policy_version": engine.policy_version,
            "running": scheduler.running,
            "waiting": scheduler.waiting,
            "steps": scheduler.stats.steps,
            "max_batch": scheduler.stats.max_batch,
        }
        if reloader is not None:
            events = [
                {"version": e.version, "applied": e.applied, "seconds": round(e.seconds, 4)} for e in reloader.events
            ]
            health["reloads"] = events[-20:]
        return health

    return app


async def _answer(engine: LocalEngine, request: Request, flavour: Flavour) -> Response:
    try:
        prompt_request, handle, reply = _submit(engine, await request.body(), flavour)
    except EngineError as exc:
        return _engine_error(exc)
    if prompt_request.stream:
        events = chat_chunks(reply, handle) if flavour == "chat" else response_events(reply, handle)
        return StreamingResponse(_sse(events, flavour, handle), media_type="text/event-stream")
    try:
        completions = await handle.completions()
    except GenerationFailedError as exc:
        return _engine_error(exc)
    finally:
        handle.cancel()  # no-op once finished; stops generation if this handler was cancelled
    if flavour == "chat":
        return JSONResponse(chat_completion(reply, completions))
    return JSONResponse(response_object(reply, Answer.of(prompt_request, completions[0])))


def _submit(engine: LocalEngine, raw: bytes, flavour: Flavour) -> tuple[PromptRequest, GenerationHandle, Reply]:
    body = parse_body(raw)
    model = body.get("model")
    if isinstance(model, str) and model and model != engine.model_name:
        raise ModelNotFoundError(
            f"the model {model!r} does not exist; this engine serves {engine.model_name!r}", "model"
        )
    prompt_request = chat_request(body) if flavour == "chat" else responses_request(body)
    prompt_ids = engine.render_prompt(prompt_request.messages, prompt_request.tools)
    max_tokens = engine.completion_budget(len(prompt_ids), prompt_request.max_tokens)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=prompt_request.temperature,
        top_p=prompt_request.top_p,
        stop=prompt_request.stop,
        seed=prompt_request.seed,
    )
    handle = engine.submit(prompt_ids, params, prompt_request.n)
    return prompt_request, handle, Reply(prompt_request, prompt_ids)


async def _sse(
    events: AsyncIterator[dict[str, Any]], flavour: Flavour, handle: GenerationHandle
) -> AsyncIterator[bytes]:
    encode: Callable[[int, dict[str, Any]], bytes] = _chat_frame if flavour == "chat" else _responses_frame
    sequence = 0
    try:
        async for event in events:
            yield encode(sequence, event)
            sequence += 1
    except GenerationFailedError as exc:
        log.warning("streamed generation failed", error=str(exc))
        error = {"message": str(exc), "type": "server_error", "param": None, "code": "generation_failed"}
        yield encode(sequence, {"error": error} if flavour == "chat" else {"type": "error", **error})
    finally:
        handle.cancel()  # the client went away, or we are done: either way stop generating
    if flavour == "chat":
        yield b"data: [DONE]\n\n"


def _chat_frame(_: int, event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()


def _responses_frame(sequence: int, event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event | {'sequence_number': sequence})}\n\n".encode()
