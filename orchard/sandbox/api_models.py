"""Wire models of the sandbox REST API that are not runtime models (those live in ``orchard.sandbox``).

Streamed ``exec`` (``POST /sandboxes/{id}/exec?stream=true``) answers NDJSON, one ``StreamLine`` per line: output
chunks as ``{"stream": "stdout"|"stderr", "data": "..."}`` (UTF-8 text, invalid bytes replaced), then exactly one
``{"stream": "exit", "exit_code": N|null, "timed_out": bool, "duration_ms": ms}`` — or one
``{"stream": "error", "error": code, "message": "..."}`` if the command could not start.

The PTY WebSocket (``/sandboxes/{id}/pty?command=...&cols=80&rows=24``) carries terminal bytes as binary frames both
ways; text frames are JSON control messages: ``PtyResize`` from the client, ``PtyExit`` from the server before it
closes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_EXEC_TIMEOUT_S = 7 * 24 * 3600.0
MAX_ARGUMENT_BYTES = 128 * 1024 - 1
"""Longest single argument or ``NAME=value`` environment entry the kernel passes to a program (MAX_ARG_STRLEN)."""
MAX_COMMAND_BYTES = 1024 * 1024
"""Most bytes of arguments and environment one command may carry (the kernel's total, ARG_MAX, is about 2 MiB and
the sandbox's own wrapper and environment need some of it)."""


def text_bytes(value: str, what: str) -> int:
    """The UTF-8 length of ``value``; ``ValueError`` naming ``what`` for text that has no UTF-8 form.

    >>> text_bytes("é", "stdin")
    2
    """
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid UTF-8 (it holds a lone surrogate)") from None


def check_argument(value: str, what: str) -> int:
    """Size in bytes of one program argument; ``ValueError`` if no program could receive it.

    >>> check_argument("a\\x00b", "argument 1")
    Traceback (most recent call last):
    ...
    ValueError: argument 1 contains a NUL byte
    """
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL byte")
    size = text_bytes(value, what)
    if size > MAX_ARGUMENT_BYTES:
        raise ValueError(f"{what} is {size} bytes long; at most {MAX_ARGUMENT_BYTES} fit in one argument")
    return size


def check_environment(env: Mapping[str, str]) -> int:
    """Size in bytes of an environment's ``NAME=value`` entries; ``ValueError`` naming the first bad variable.

    >>> check_environment({"A=B": "1"})
    Traceback (most recent call last):
    ...
    ValueError: environment variable name 'A=B' contains '=' (not a valid name)
    """
    total = 0
    for name, value in env.items():
        if not name:
            raise ValueError("an environment variable name is empty")
        if "=" in name:
            raise ValueError(f"environment variable name {name!r} contains '=' (not a valid name)")
        check_argument(name, f"environment variable name {name!r}")
        total += check_argument(f"{name}={value}", f"environment variable {name!r}") + 1
    return total


class ExecRequest(BaseModel):
    """``POST /sandboxes/{id}/exec``: what to run and how."""

    model_config = ConfigDict(extra="forbid")

    command: list[str] | str = Field(description="argv, or a string run through /bin/sh -c.")
    timeout_s: float = Field(60.0, gt=0, le=MAX_EXEC_TIMEOUT_S, description="The whole tree is killed after this.")
    cwd: str = Field(".", description="Working directory, relative to the working copy.")
    env: dict[str, str] | None = Field(None, description="Extra environment variables for this command.")
    stdin: str | None = Field(None, description="Text fed to the command's standard input (not with stream=true).")

    @field_validator("command")
    @classmethod
    def _runnable(cls, command: list[str] | str) -> list[str] | str:
        words = [command] if isinstance(command, str) else command
        for index, word in enumerate(words):
            check_argument(word, "the command" if isinstance(command, str) else f"argument {index}")
        return command

    @field_validator("env")
    @classmethod
    def _valid_environment(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        check_environment(env or {})
        return env

    @field_validator("cwd")
    @classmethod
    def _valid_cwd(cls, cwd: str) -> str:
        check_argument(cwd, "cwd")
        return cwd

    @field_validator("stdin")
    @classmethod
    def _valid_stdin(cls, stdin: str | None) -> str | None:
        if stdin is not None:
            text_bytes(stdin, "stdin")
        return stdin

    @model_validator(mode="after")
    def _fits(self) -> ExecRequest:
        words = [self.command] if isinstance(self.command, str) else self.command
        size = sum(len(word.encode()) + 1 for word in words) + check_environment(self.env or {})
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"command and environment are {size} bytes; at most {MAX_COMMAND_BYTES} fit")
        return self


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
