"""Wire models of the sandbox REST API that are not runtime models (those live in ``orchard.env.runtime``).

Streamed ``exec`` (``POST /sandboxes/{id}/exec?stream=true``) answers NDJSON, one ``StreamLine`` per line: output
chunks as ``{"stream": "stdout"|"stderr", "data": "..."}`` (UTF-8 text, invalid bytes replaced), then exactly one
``{"stream": "exit", "exit_code": N|null, "timed_out": bool, "duration_ms": ms}`` — or one
``{"stream": "error", "error": code, "message": "..."}`` if the command could not start.

The PTY WebSocket (``/sandboxes/{id}/pty?command=...&cols=80&rows=24``) carries terminal bytes as binary frames both
ways; text frames are JSON control messages: ``PtyResize`` from the client, ``PtyExit`` from the server before it
closes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_EXEC_TIMEOUT_S = 7 * 24 * 3600.0


class ExecRequest(BaseModel):
    """``POST /sandboxes/{id}/exec``: what to run and how."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | str = Field(description="argv, or a string run through /bin/sh -c.")
    timeout_s: float = Field(60.0, gt=0, le=MAX_EXEC_TIMEOUT_S, description="The whole tree is killed after this.")
    cwd: str = Field(".", description="Working directory, relative to the working copy.")
    env: dict[str, str] | None = Field(None, description="Extra environment variables for this command.")
    stdin: str | None = Field(None, description="Text fed to the command's standard input (not with stream=true).")


class PatchRequest(BaseModel):
    """``POST /sandboxes/{id}/patch``: a unified diff with ``a/`` and ``b/`` prefixes."""

    model_config = ConfigDict(extra="forbid")

    patch: str


class ErrorBody(BaseModel):
    """Every error response: a stable code and a message for people."""

    error: str
    message: str


class StreamLine(BaseModel):
    """One NDJSON line of a streamed ``exec``."""

    stream: Literal["stdout", "stderr", "exit", "error"]
    data: str | None = None
    exit_code: int | None = None
    timed_out: bool | None = None
    duration_ms: float | None = None
    error: str | None = None
    message: str | None = None


class PtyResize(BaseModel):
    """Client to server: the terminal's new size."""

    type: Literal["resize"] = "resize"
    cols: int = Field(ge=1, le=10_000)
    rows: int = Field(ge=1, le=10_000)


class PtyExit(BaseModel):
    """Server to client: the process ended (sent just before the server closes the socket)."""

    type: Literal["exit"] = "exit"
    exit_code: int | None
