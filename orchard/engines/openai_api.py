"""The engine's OpenAI-compatible HTTP API: ``/v1/chat/completions``, ``/v1/responses``, ``/v1/completions``,
``/v1/tokenize``, ``/v1/models``, ``/healthz``.

``create_engine_app(engine)`` wraps a ``LocalEngine`` (its lifespan starts and stops the engine's worker, and the
policy reloader when one is given). Each request is checked (``openai_requests``), rendered by the model's chat
template, queued on the scheduler and answered (``openai_output``), streamed as server-sent events when asked.
The legacy ``/v1/completions`` takes raw prompts (text or token ids, no chat template) and, with ``echo`` and
``logprobs``, answers each prompt token's logprob from one forward pass (``LocalEngine.score``); ``max_tokens: 0``
makes it a pure scoring call (vLLM answers the same request with ``max_tokens: 1``), which on-policy distillation
sends to a teacher. ``/v1/tokenize`` takes a chat completions body and answers the prompt it renders to, as vLLM's
``/tokenize`` does: ``{"count", "max_model_len", "tokens"}`` (the recording proxy's ``count_tokens`` asks it).
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
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from orchard.engines.batching import Completion, GenerationHandle
from orchard.engines.exceptions import (
    ContextLengthError,
    EngineError,
    GenerationFailedError,
    ModelNotFoundError,
)
from orchard.engines.openai_common import engine_error_response, model_list
from orchard.engines.openai_output import (
    Answer,
    CompletionChoice,
    Reply,
    chat_chunks,
    chat_completion,
    response_events,
    response_object,
    text_completion,
)
from orchard.engines.openai_requests import (
    CompletionRequest,
    Flavour,
    PromptRequest,
    chat_request,
    completion_request,
    parse_body,
    responses_request,
)
from orchard.engines.sampling import SamplingParams
from orchard.logging import get_logger

if TYPE_CHECKING:
    from orchard.engines.local import LocalEngine
    from orchard.engines.reload import PolicyReloader

log = get_logger("engines.api")


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

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        try:
            return JSONResponse(await _complete(engine, await request.body()))
        except EngineError as exc:
            return engine_error_response(exc)

    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            return JSONResponse(_tokenize(engine, await request.body()))
        except EngineError as exc:
            return engine_error_response(exc)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(engine.model_name, max_model_len=engine.max_context)

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
            "prefilled_tokens": scheduler.stats.prefilled_tokens,
            "reused_tokens": scheduler.stats.reused_tokens,  # prompt tokens the prefix cache spared
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
        return engine_error_response(exc)
    if prompt_request.stream:
        events = chat_chunks(reply, handle) if flavour == "chat" else response_events(reply, handle)
        return StreamingResponse(_sse(events, flavour, handle), media_type="text/event-stream")
    try:
        completions = await handle.completions()
    except GenerationFailedError as exc:
        return engine_error_response(exc)
    finally:
        handle.cancel()  # no-op once finished; stops generation if this handler was cancelled
    if flavour == "chat":
        return JSONResponse(chat_completion(reply, completions))
    return JSONResponse(response_object(reply, Answer.of(prompt_request, completions[0])))


def _tokenize(engine: LocalEngine, raw: bytes) -> dict[str, Any]:
    """The prompt token ids a chat completions body renders to (nothing is generated)."""
    body = parse_body(raw)
    _check_model(engine, body)
    request = chat_request(body)
    ids = engine.render_prompt(request.messages, request.tools)
    return {"count": len(ids), "max_model_len": engine.max_context, "tokens": ids}


async def _complete(engine: LocalEngine, raw: bytes) -> dict[str, Any]:
    body = parse_body(raw)
    _check_model(engine, body)
    request = completion_request(body)
    prompts = [engine.encode_text(p) if isinstance(p, str) else list(p) for p in request.prompts]
    for ids in prompts:
        engine.check_token_ids(ids)
        _check_context(engine, len(ids), request.max_tokens)
    generated = await _generate(engine, request, prompts)
    choices = []
    for prompt, ids, completions in zip(request.prompts, prompts, generated, strict=True):
        prompt_text = prompt if isinstance(prompt, str) else engine.tokenizer.decode(ids)
        for completion in completions:
            choices.append(await _completion_choice(engine, request, ids, prompt_text, completion))
    usage = (sum(map(len, prompts)), sum(len(c.token_ids) for cs in generated for c in cs if c is not None))
    return text_completion(request, uuid.uuid4().hex, choices, usage, lambda t: engine.tokenizer.decode([t]))


async def _generate(
    engine: LocalEngine, request: CompletionRequest, prompts: list[list[int]]
) -> list[list[Completion | None]]:
    """Every prompt's ``n`` completions (all submitted before any is awaited, so they share batches); ``None``
    choices when ``max_tokens == 0``."""
    if request.max_tokens == 0:
        return [[None] * request.n for _ in prompts]
    params = SamplingParams(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=request.stop,
        seed=request.seed,
    )
    handles: list[GenerationHandle] = []
    try:
        for ids in prompts:
            handles.append(engine.submit(ids, params, request.n))
        return [list(await handle.completions()) for handle in handles]
    finally:
        for handle in handles:
            handle.cancel()


async def _completion_choice(
    engine: LocalEngine,
    request: CompletionRequest,
    prompt_ids: list[int],
    prompt_text: str,
    completion: Completion | None,
) -> CompletionChoice:
    """One choice; logprobs of echoed prompt tokens (and alternatives of generated ones) from a scoring pass."""
    new_ids = completion.token_ids if completion is not None else []
    new_logprobs: list[float | None] = list(completion.logprobs) if completion is not None else []
    shown = (prompt_ids if request.echo else []) + new_ids
    text = (prompt_text if request.echo else "") + (completion.text if completion is not None else "")
    finish = completion.finish_reason if completion is not None else "length"
    logprobs: list[float | None] = [None] * len(shown)
    top: list[dict[int, float] | None] = [{t: lp} for t, lp in zip(new_ids, new_logprobs, strict=True)]
    top = ([None] * len(prompt_ids) if request.echo else []) + top
    if request.logprobs is not None and (request.echo or request.logprobs > 0):
        scores, _ = await asyncio.to_thread(engine.score, prompt_ids + new_ids, request.logprobs)
        skip = 0 if request.echo else len(prompt_ids)
        top = scores.top[skip:]
        logprobs = scores.logprobs[skip:]
    if new_ids:  # generated tokens keep the logprobs they were sampled with
        logprobs[len(shown) - len(new_ids) :] = new_logprobs
    return CompletionChoice(text, shown, logprobs, top, finish)


def _check_context(engine: LocalEngine, prompt_tokens: int, max_tokens: int) -> None:
    if prompt_tokens + max_tokens > engine.max_context:
        raise ContextLengthError(
            f"this model's context is {engine.max_context} tokens; you requested {prompt_tokens + max_tokens} "
            f"({prompt_tokens} in the prompt, {max_tokens} for the completion)",
            "prompt" if max_tokens == 0 else "max_tokens",
        )


def _check_model(engine: LocalEngine, body: dict[str, Any]) -> None:
    model = body.get("model")
    if isinstance(model, str) and model and model != engine.model_name:
        raise ModelNotFoundError(
            f"the model {model!r} does not exist; this engine serves {engine.model_name!r}", "model"
        )


def _submit(engine: LocalEngine, raw: bytes, flavour: Flavour) -> tuple[PromptRequest, GenerationHandle, Reply]:
    body = parse_body(raw)
    _check_model(engine, body)
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
