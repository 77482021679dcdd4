"""Errors of the inference engines; the OpenAI layer maps each to an HTTP status and an OpenAI error object."""

from __future__ import annotations

from orchard.exceptions import OrchardError


class EngineError(OrchardError):
    """Base class of engine errors."""


class InvalidRequestError(EngineError, ValueError):
    """A request the engine cannot serve as asked (HTTP 400); ``param`` names the offending field."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class ContextLengthError(InvalidRequestError):
    """Prompt plus requested completion exceed the engine's context (HTTP 400, ``context_length_exceeded``)."""

    code = "context_length_exceeded"


class ModelNotFoundError(InvalidRequestError):
    """The request names a model this engine does not serve (HTTP 404)."""

    status = 404
    code = "model_not_found"


class EngineOverloadedError(EngineError):
    """The request queue is full (HTTP 503); the client should retry later."""


class GenerationFailedError(EngineError):
    """The model failed while generating a request (HTTP 500)."""


class CheckpointError(EngineError):
    """A checkpoint or published version cannot be loaded (missing, corrupt, or incompatible with the engine)."""
