"""What every OpenAI-compatible backend of the engine answers alike: the error object an ``EngineError`` becomes, and
the ``/v1/models`` list.

The local engine (``openai_api``), the vLLM shim (``vllm_backend``) and the scripted backend (``scripted``) import
it; it imports neither torch nor vLLM, so the light backends stay light.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from orchard.engines.exceptions import EngineError, EngineOverloadedError, GenerationFailedError, InvalidRequestError

RETRY_AFTER_S = 1
"""What a 503 answer asks the client to wait before it retries, seconds."""


def error_response(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """An OpenAI error object (``invalid_request_error`` below 500, else ``server_error``; a 503 says when to retry)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    error = {"message": message, "type": kind, "param": param, "code": code}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def engine_error_response(exc: EngineError) -> JSONResponse:
    """The OpenAI error object of an engine error: the request's own status and code for an invalid request, 503
    ``engine_overloaded``, 500 ``generation_failed``, else 503 ``engine_unavailable``."""
    if isinstance(exc, InvalidRequestError):
        return error_response(exc.status, str(exc), exc.code, exc.param)
    if isinstance(exc, EngineOverloadedError):
        return error_response(503, str(exc), "engine_overloaded")
    if isinstance(exc, GenerationFailedError):
        return error_response(500, str(exc), "generation_failed")
    return error_response(503, str(exc), "engine_unavailable")


def model_list(model_id: str, **details: Any) -> dict[str, Any]:
    """The ``/v1/models`` answer listing one model; ``details`` (vLLM's ``max_model_len``) join its entry."""
    entry = {"id": model_id, "object": "model", "created": 0, "owned_by": "orchard"}
    return {"object": "list", "data": [entry | details]}
