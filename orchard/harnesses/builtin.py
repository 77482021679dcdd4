"""Adapter of Orchard's built-in agent (``orchard.harnesses.builtin_agent``), run with any Python 3.11+ (the agent
needs only the standard library).

Files in the sandbox (``~/.orchard/harness/builtin/``): ``builtin_agent.py`` (the agent's source, copied from this
process's own ``orchard``), ``task.md`` (the instruction) and ``trajectory.jsonl`` (what the agent writes). The proxy
token reaches the agent as ``OPENAI_API_KEY``. Every episode pays for each sandbox exec (a sandboxed process start),
so the agent's own command writes both files before it starts the agent (the task text as an argument, the source on
stdin; ``prepare`` writes them in execs of their own only when the text is too long for an argument), and once the
agent exits the same command prints the trajectory and the working copy's changes (``collect_after_agent``), so an
episode costs one exec; ``collect`` reads them in an exec of its own only where that output did not come (the
command killed at its deadline, output cut at the runtime's limit, a task whose workdir is not the root).

The agent runs as ``python -I -S -u ~/.orchard/harness/builtin/builtin_agent.py``: isolated mode ignores every
``PYTHON*`` variable (a ``PYTHONPATH`` or ``PYTHONHOME`` meant for someone else), the user's site-packages, and the
working directory, so neither the sandbox's environment nor a task's own ``orchard`` package in the working copy
decides which code runs, and the agent does not depend on where (or whether) the interpreter finds ``orchard``: a
checkout the Env imported through its own ``PYTHONPATH`` may be invisible inside the sandbox. ``-S`` skips ``site``
(site-packages, ``.pth`` files, ``sitecustomize``), which the agent does not need and every start would pay for.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from orchard.harnesses.base import (
    SETUP_TIMEOUT_S,
    STATE_DIR,
    Collected,
    HarnessAdapter,
    HarnessArtifacts,
    HarnessSetupError,
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    collect_after_agent,
    read_state_file_and_changes,
    shell_command,
    split_collected,
    write_state_file,
)
from orchard.harnesses.json_lines import json_objects
from orchard.sandbox import Sandbox

TASK_FILE = "task.md"
TRAJECTORY_FILE = "trajectory.jsonl"
AGENT_FILE = "builtin_agent.py"
AGENT_SOURCE = Path(__file__).with_name("builtin_agent.py")
ISOLATED = ("-I", "-S", "-u")
"""Interpreter flags: isolated mode (no ``PYTHON*`` variables, user site or working directory on the path), no
``site`` (the agent needs only the standard library: no site-packages, ``.pth`` files or ``sitecustomize`` to load at
every start), and unbuffered output."""


@dataclass(frozen=True)
class AgentPackage:
    """An agent run as ``python -P -m <module>`` from its package's source files, which the adapter writes into the
    sandbox under ``~/.orchard/harness/<name>/src/`` and puts first on ``PYTHONPATH``: it runs with the sandbox's
    interpreter whether or not the checkout that holds the package is visible inside the sandbox."""

    module: str
    """The agent's module, e.g. ``recipes.claw.agent``: its package is ``source_dir``."""
    source_dir: Path
    """The package's directory on this machine."""
    files: tuple[str, ...]
    """What the agent needs inside the sandbox, relative to ``source_dir`` (its ``__init__.py`` included)."""
    parent_init: str
    """The text of the ``__init__.py`` written for each package above the agent's own."""

    def sources(self) -> list[tuple[str, bytes]]:
        """``(path under src/, content)`` of every file to write: the parents' ``__init__.py``, then ``files``."""
        package = self.module.rpartition(".")[0].split(".")
        above = ["/".join(package[:depth]) for depth in range(1, len(package))]
        own = "/".join(package)
        return [(f"{parent}/__init__.py", self.parent_init.encode()) for parent in above] + [
            (f"{own}/{name}", (self.source_dir / name).read_bytes()) for name in self.files
        ]


SRC = "src"
"""Where an ``AgentPackage`` is written, under the adapter's state directory."""


class BuiltinAgentAdapter(HarnessAdapter):
    """Runs the built-in agent's source file with ``python -I -S -u`` against the endpoint.

    A subclass runs another agent with the built-in agent's command line (the endpoint, task and trajectory files,
    limits and sampling options) by naming its ``package`` and its own options (``agent_options``): the Claw and the
    browser harnesses do."""

    name = "builtin"
    package: ClassVar[AgentPackage | None] = None
    """The agent to run instead of the built-in one, shipped into the sandbox (None: the built-in agent)."""
    files_in_command: ClassVar[bool] = True
    """Whether ``command`` writes the task text and the agent's source itself (when the text fits in an argument;
    never with a ``package``, whose command is ``python -m``); otherwise ``prepare`` writes them."""

    def __init__(
        self,
        python: str = sys.executable,
        command_timeout_s: float = 120.0,
        max_output_chars: int = 10_000,
        retries: int = 3,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        """``python``: the interpreter inside the sandbox (default: this one).
        The rest are the agent's command-line options of the same names; ``extra_body`` is merged into requests;
        ``seed`` makes the episode's sampling reproducible (its ``i``-th call asks with ``seed + i``)."""
        self.python = python
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.retries = retries
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        if seed is not None and not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        self.seed = seed

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write the task text and the agent's source, unless the command does (``files_in_command``); in one
        sandbox exec when the text fits in an argument. Then the ``package``'s files, if any."""
        if self._command_writes_files(task):
            return
        self._write_task_and_source(sandbox, task)
        if self.package is not None:
            for relpath, source in self.package.sources():
                write_state_file(sandbox, self.state(f"{SRC}/{relpath}"), source)

    def _write_task_and_source(self, sandbox: Sandbox, task: HarnessTask) -> None:
        if not _fits_in_argument(task.instruction):
            write_state_file(sandbox, self.state(TASK_FILE), task.instruction)
            write_state_file(sandbox, self.state(AGENT_FILE), agent_source())
            return
        argv = ["/bin/sh", "-c", _write_both(self.name, '"$1"'), "orchard-write", task.instruction]
        result = sandbox.exec(argv, timeout_s=SETUP_TIMEOUT_S, stdin=agent_source())
        if result.exit_code != 0:
            raise HarnessSetupError(f"cannot write the built-in agent's files in the sandbox: {result.stderr.strip()}")

    def _command_writes_files(self, task: HarnessTask) -> bool:
        return self.files_in_command and self.package is None and _fits_in_argument(task.instruction)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``python -I -S -u builtin_agent.py`` (or ``python -P -m`` the ``package``'s module, with the shipped
        sources on ``PYTHONPATH``) with the endpoint, limits and state file paths."""
        if self.package is None:
            program: list[ShellArg] = [self.python, *ISOLATED, self.state(AGENT_FILE)]
        else:  # -P: the working copy never shadows the agent
            program = [self.python, "-P", "-m", self.package.module]
        argv: list[ShellArg] = [
            *program,
            "--base-url", endpoint.base_url,
            "--model", endpoint.model,
            "--task-file", self.state(TASK_FILE),
            "--trajectory", self.state(TRAJECTORY_FILE),
            "--max-steps", str(task.max_steps),
            "--timeout", f"{task.timeout_s:g}",
            *self.agent_options(),
            "--retries", str(self.retries),
        ]  # fmt: skip
        if self.temperature is not None:
            argv += ["--temperature", f"{self.temperature:g}"]
        if self.max_tokens is not None:
            argv += ["--max-tokens", str(self.max_tokens)]
        if self.extra_body:
            argv += ["--extra-body", json.dumps(self.extra_body)]
        if self.seed is not None:
            argv += ["--seed", str(self.seed)]
        after = collect_after_agent(self.name, TRAJECTORY_FILE) if _collects_in_command(task) else []
        if self.package is not None:
            return shell_command(argv, exports={"PYTHONPATH": self.state(SRC)}, after=after)
        setup = [_write_both(self.name, shlex.quote(task.instruction))] if self._command_writes_files(task) else []
        return shell_command(argv, setup=setup, after=after)

    def agent_options(self) -> list[str]:
        """The agent's own options, besides those every agent run this way takes: the built-in agent's (and the
        Claw agent's) tool limits."""
        return ["--command-timeout", f"{self.command_timeout_s:g}", "--max-output-chars", str(self.max_output_chars)]

    def stdin(self, task: HarnessTask) -> bytes:
        """The agent's source, which the command writes to its file first (when ``prepare`` did not)."""
        return agent_source() if self._command_writes_files(task) else b""

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """The proxy token as ``OPENAI_API_KEY``; unbuffered Python output."""
        return {"OPENAI_API_KEY": endpoint.api_key.get_secret_value(), "PYTHONUNBUFFERED": "1"}

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """The trajectory JSONL, its ``end`` record's status and submission, and the working copy's patch (one exec)."""
        return self._artifacts(sandbox, task)

    def collect_run(
        self, sandbox: Sandbox, task: HarnessTask, stdout: str, stderr: str
    ) -> tuple[str, HarnessArtifacts]:
        """What ``collect`` reads, from the end of the command's own output when it printed it there (no exec);
        ``collect``'s exec when it did not (killed at its deadline, output cut at the runtime's limit)."""
        if type(self).collect is not BuiltinAgentAdapter.collect:  # a subclass collects its own way
            return stdout, self.collect(sandbox, task)
        own, collected = split_collected(stdout, stderr) if _collects_in_command(task) else (stdout, None)
        return own, self._artifacts(sandbox, task, collected)

    def _artifacts(self, sandbox: Sandbox, task: HarnessTask, collected: Collected | None = None) -> HarnessArtifacts:
        text, patch, changed = read_state_file_and_changes(sandbox, self.name, TRAJECTORY_FILE, task.workdir, collected)
        end = _last_end_record(text or "")
        return HarnessArtifacts(
            harness=self.name,
            exit_status=end.get("status"),
            final_message=end.get("submission"),
            trajectory={} if text is None else {self.state(TRAJECTORY_FILE).display(): text},
            patch=patch,
            changed_files=changed,
        )


def _collects_in_command(task: HarnessTask) -> bool:
    """Whether the command reads the trajectory and the patch itself once the agent exits (``collect_after_agent``):
    one sandboxed exec fewer per episode, where it runs in the working copy's root as that exec would."""
    return task.workdir in (".", "")


def _write_both(harness: str, instruction: str) -> str:
    """Shell code that writes the shell word ``instruction`` (quoted text, or ``"$1"``) to ``task.md`` and stdin
    (the agent's source) to ``builtin_agent.py``, or exits 125 saying so (in the command, the exit status
    ``run_harness`` reports: the agent never started)."""
    directory = f'"${{HOME:?}}"/{STATE_DIR}/{shlex.quote(harness)}'
    failed = '{ echo "orchard: cannot write the built-in agent\'s files in $d" >&2; exit 125; }'
    return (
        f'd={directory} && mkdir -p "$d" && printf %s {instruction} > "$d/{TASK_FILE}" && '
        f'cat > "$d/{AGENT_FILE}" || {failed}'
    )


@cache
def agent_source() -> bytes:
    """The built-in agent's source, as shipped with this process's ``orchard``."""
    return AGENT_SOURCE.read_bytes()


MAX_ARGUMENT_BYTES = 32_768
"""Longest task text passed as an argument; a longer one goes on stdin, in an exec of its own (Linux refuses one
argument over 128 KiB, and an exec through the Kubernetes API carries its argv in the URL)."""


def _fits_in_argument(text: str) -> bool:
    return "\0" not in text and len(text.encode()) <= MAX_ARGUMENT_BYTES


def _last_end_record(text: str) -> dict[str, Any]:
    ends = [record for record in json_objects(text) if record.get("event") == "end"]
    return ends[-1] if ends else {}
