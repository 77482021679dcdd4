"""Errors of the recording proxy; each is answered to the harness as an OpenAI error object (on the Anthropic
``/v1/messages`` routes as Anthropic's, with the same status: ``producers.proxy.messages_reply.anthropic_error``).

The body is always ``{"error": {"message", "type", "param", "code"}}``, the shape OpenAI clients parse, with the
HTTP status a client expects: 400 bad request, 401 unknown token, 404/409 admin lookups, 413 oversized body, 502 a
backend that failed or answered without a token trace, 504 a backend that timed out (and 499, read by no one, for a
harness that hung up before its answer). A backend's own 4xx is passed through unchanged (``BackendRejectedError``).
"""

from __future__ import annotations

from typing import Any

from orchard.exceptions import OrchardError


class ProxyError(OrchardError):
    """An error the proxy answers with ``status`` and an OpenAI error object."""

    status: int = 500
    error_type: str = "server_error"
    code: str = "proxy_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        """``code`` overrides the class's machine-readable error code."""
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def payload(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {"error": {"message": self.message, "type": self.error_type, "param": None, "code": self.code}}


class BadRequestError(ProxyError):
    """Malformed JSON, a missing or mistyped field, an unsupported option."""

    status, error_type, code = 400, "invalid_request_error", "invalid_request"


class AuthenticationError(ProxyError):
    """No token, or an unknown, expired or revoked one."""

    status, error_type, code = 401, "invalid_request_error", "invalid_api_key"


class NotFoundError(ProxyError):
    """No such episode or route."""

    status, error_type, code = 404, "invalid_request_error", "not_found"


class ConflictError(ProxyError):
    """An episode id that is already registered."""

    status, error_type, code = 409, "invalid_request_error", "conflict"


class RequestTooLargeError(ProxyError):
    """A request body over ``max_request_bytes``."""

    status, error_type, code = 413, "invalid_request_error", "request_too_large"


class BackendUnavailableError(ProxyError):
    """The backend could not be reached, or broke the connection."""

    status, error_type, code = 502, "server_error", "backend_unavailable"


class BackendError(ProxyError):
    """The backend failed (5xx), answered something unreadable, or answered without a valid token trace."""

    status, error_type, code = 502, "server_error", "backend_error"


class BackendTimeoutError(ProxyError):
    """The backend did not answer within ``request_timeout_s``."""

    status, error_type, code = 504, "server_error", "backend_timeout"


class HarnessGoneError(ProxyError):
    """The harness closed its connection before its call was answered (the answer has no one to go to)."""

    status, error_type, code = 499, "invalid_request_error", "client_closed_request"


class RecordingIncompleteError(ProxyError):
    """Closing an episode: some of its calls were not acknowledged by the bus (or failed to publish)."""

    status, error_type, code = 503, "server_error", "recording_incomplete"

    def __init__(self, message: str, episode: dict[str, Any]) -> None:
        """``episode``: the episode's summary, sent beside the error."""
        super().__init__(message)
        self.episode = episode

    def payload(self) -> dict[str, Any]:
        """The error object and the episode's summary."""
        return super().payload() | {"episode": self.episode}


class BackendRejectedError(ProxyError):
    """The backend refused the request with a 4xx; its status and body reach the harness unchanged."""

    error_type, code = "invalid_request_error", "backend_rejected"

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        """``body``: the backend's JSON body (an OpenAI error object, or wrapped into one)."""
        message = str((body.get("error") or {}).get("message", "")) if isinstance(body.get("error"), dict) else ""
        super().__init__(message or f"backend answered {status}")
        self.status, self.body = status, body

    def payload(self) -> dict[str, Any]:
        """The backend's own body."""
        return self.body
