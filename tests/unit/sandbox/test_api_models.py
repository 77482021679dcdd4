"""What the sandbox API refuses before a command starts, and the doctests of the modules that decide it."""

from __future__ import annotations

import doctest
import importlib

import pytest
from pydantic import ValidationError

from orchard.sandbox.api_models import MAX_ARGUMENT_BYTES, ExecRequest
from orchard.sandbox.exceptions import InvalidSandboxRequestError, PathEscapeError
from orchard.sandbox.safe_fs import split_path


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"command": ["echo", "a\0"]}, "argument 1 contains a NUL byte"),
        ({"command": "echo \0"}, "the command contains a NUL byte"),
        ({"command": "true", "env": {"A=B": "1"}}, "'A=B' contains '='"),
        ({"command": "true", "env": {"": "1"}}, "name is empty"),
        ({"command": "true", "env": {"A": "\0"}}, "variable 'A' contains a NUL byte"),
        ({"command": "true", "cwd": "a\0"}, "cwd contains a NUL byte"),
        ({"command": "cat", "stdin": "\ud800"}, "stdin is not valid UTF-8"),
        ({"command": ["echo", "x" * (MAX_ARGUMENT_BYTES + 1)]}, "at most 131071 fit in one argument"),
        ({"command": ["echo", *(["x" * 1000] * 1100)]}, "at most 1048576 fit"),
    ],
)
def test_an_exec_no_program_could_receive_is_refused_with_the_reason(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ExecRequest.model_validate(fields)


def test_an_exec_with_stdin_nul_bytes_and_unusual_names_is_fine() -> None:
    request = ExecRequest(command=["printf", "é"], env={"weird.name-1": "x=y"}, stdin="a\0b")
    assert (request.command, request.env, request.stdin) == (["printf", "é"], {"weird.name-1": "x=y"}, "a\0b")


@pytest.mark.parametrize(
    ("path", "error", "reason"),
    [
        ("a" * 256, InvalidSandboxRequestError, "256 bytes long; the limit is 255"),
        ("é" * 128, InvalidSandboxRequestError, "256 bytes long"),
        ("/".join(["d" * 100] * 41), InvalidSandboxRequestError, "the limit is 4095"),
        ("a/\ud800", InvalidSandboxRequestError, "not valid UTF-8"),
        ("/etc", PathEscapeError, "absolute path"),
    ],
)
def test_paths_no_file_system_takes_are_refused(path: str, error: type[Exception], reason: str) -> None:
    with pytest.raises(error, match=reason):
        split_path(path)


def test_the_longest_names_pass() -> None:
    assert split_path("a" * 255 + "/\udcff") == ["a" * 255, "\udcff"]  # an undecodable byte of a listed name


@pytest.mark.parametrize(
    "module",
    ["orchard.sandbox.api", "orchard.sandbox.api_models", "orchard.env.episode_runner", "orchard.sandbox.safe_fs"],
)
def test_doctests(module: str) -> None:
    results = doctest.testmod(importlib.import_module(module))
    assert (results.failed, results.attempted > 0) == (0, True)
