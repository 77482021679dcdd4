"""What goes wrong talking to the cluster, as sandbox errors: the runtime's own error classes, and the wrapping of the
client's transport failures and of the API server's refusals into them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
import websocket
from kubernetes.client.exceptions import ApiException

from orchard.sandbox.exceptions import SandboxError, SandboxStartError


class KubernetesRuntimeError(SandboxError):
    """The cluster refused or failed an operation (an infrastructure failure, not the agent's)."""


class KubernetesStartError(KubernetesRuntimeError, SandboxStartError):
    """An episode pod could not be created or did not start; what the attempt created was removed."""


TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, websocket.WebSocketException, OSError)
"""What the client raises when the API server cannot be reached (refused, reset, timed out), as opposed to an
``ApiException`` with the server's answer."""

_Method = TypeVar("_Method", bound=Callable[..., Any])


def unreachable_is_a_runtime_error(method: _Method) -> _Method:
    """Turn the client's transport errors into ``KubernetesRuntimeError`` naming the call (a sandbox error of the
    runtime's own, which callers already handle), leaving the runtime's own errors as they are."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except SandboxError:
            raise
        except TRANSPORT_ERRORS as exc:
            raise KubernetesRuntimeError(f"{method.__name__}: the API server could not be reached: {exc}") from exc

    return wrapper  # type: ignore[return-value]


def ignore_missing(call: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    """Call a delete; False when the object was already gone."""
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise KubernetesRuntimeError(f"delete failed: {describe_api_error(exc)}") from exc
    return True


def describe_api_error(exc: BaseException) -> str:
    """An API server's answer (status, reason, the start of its body), or any other exception, in one line."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}: {(exc.body or '')[:500]}"
    return f"{type(exc).__name__}: {exc}"
