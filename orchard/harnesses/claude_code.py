"""Adapter of Anthropic's Claude Code (npm ``@anthropic-ai/claude-code``), run headless with ``claude -p``.

How it is run (checked against Claude Code 2.1.332)::

    CLAUDE_CONFIG_DIR=~/.orchard/harness/claude-code/config ANTHROPIC_BASE_URL=<proxy root> \
    ANTHROPIC_AUTH_TOKEN=<token> ANTHROPIC_MODEL=<model> ... (the variables of ``settings_env``) \
    claude -p --output-format stream-json --verbose --dangerously-skip-permissions --model <model> \
        --max-turns <max_steps> < ~/.orchard/harness/claude-code/task.md > ~/.orchard/harness/claude-code/events.jsonl

What was found, and why each setting:

- Claude Code speaks only the Anthropic Messages API, streamed: ``POST {ANTHROPIC_BASE_URL}/v1/messages?beta=true``
  with ``Authorization: Bearer $ANTHROPIC_AUTH_TOKEN`` (``ANTHROPIC_API_KEY`` would send ``x-api-key``), so the base
  URL is the proxy's root, without ``/v1``. The first prompt is ~75 KB (a system prompt of three text blocks, 21
  tools, and ``<system-reminder>`` blocks before the task). Its tools are its own: ``Bash`` (``{"command"}``),
  ``Read`` / ``Edit`` / ``Write`` (``{"file_path", ...}``; relative paths resolve against the working directory,
  and ``Edit`` needs the file ``Read`` first), ``Agent``, ``WebFetch``, ``WebSearch``, ... A reply without a tool
  call ends the run.
- For a model it does not know (any policy name), Claude Code 2.1 assumes the newest model's capabilities: it puts
  the environment section of its prompt into a ``{"role": "system"}`` turn inside ``messages`` and may add or remove
  tools mid-conversation. ``CLAUDE_CODE_MODEL_CAPABILITIES=-mid_conv_system,-mid_conv_tool_change`` tells it the
  served model has neither (the environment section then goes into a ``<system-reminder>`` of the first user turn,
  as for the models before them), and ``CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1`` (documented for LLM gateways)
  drops the experimental betas: deferred tools behind ``ToolSearch``, context-management edits. With both, every
  call offers the same tools and each prompt extends the previous one. ``capabilities`` and
  ``experimental_betas`` change them.
- ``-p`` is headless (no trust dialog, no onboarding); ``--dangerously-skip-permissions`` because the sandbox is
  Orchard's (nobody is there to approve a command); ``IS_SANDBOX=1`` says so, which Claude Code requires to bypass
  permissions as root (a stand-in sandbox without its own uid). ``--max-turns`` = ``task.max_steps``; Claude Code
  has no wall-clock limit (the sandbox's ``task.timeout_s`` bounds the run).
- ``CLAUDE_CONFIG_DIR`` points into the sandbox's home: settings, ``.claude.json``, session transcripts and plugin
  state are per episode; nothing of a host ``~/.claude`` is read. ``--model`` and ``ANTHROPIC_MODEL`` name the
  policy; ``ANTHROPIC_DEFAULT_HAIKU_MODEL`` / ``ANTHROPIC_SMALL_FAST_MODEL`` and ``CLAUDE_CODE_SUBAGENT_MODEL`` too,
  so a background or subagent call asks for the same model.
- No telemetry, error reports, update checks, surveys or other non-essential traffic: ``DISABLE_TELEMETRY``,
  ``DISABLE_ERROR_REPORTING``, ``DISABLE_AUTOUPDATER``, ``DISABLE_BUG_COMMAND``,
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``, ``CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY``, ``DISABLE_COST_WARNINGS``,
  ``CLAUDE_CODE_DISABLE_TERMINAL_TITLE`` (all ``1``). The sandbox reaches only the proxy anyway.
- The task is the prompt, verbatim, on stdin from the task file (``-p`` without a prompt argument reads stdin; the
  text arrives byte for byte, trailing newlines included, and no argument length limit applies).

How it ended is read from its own output, never from the exit status: the last ``{"type": "result"}`` event of the
``stream-json`` output. Claude Code exits 1 after an API error but reports it as ``subtype: "success"`` with
``is_error: true`` and ``result: "API Error: ..."``; ``exit_status`` is then ``error``, else the ``subtype``
(``success``, ``error_max_turns``, ``error_during_execution``, ...), and None without a result event (it crashed).

Artifacts: the ``stream-json`` events (``events.jsonl``: the init event with the tools offered, every assistant and
user message, the result), the session transcripts (``$CLAUDE_CONFIG_DIR/projects/<cwd>/<session>.jsonl``, and
subagents' under it), the result's text as the final message, and the working copy's patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.harnesses.base import HarnessArtifacts, HarnessTask, ModelEndpoint, ShellArg, find_npm_harness
from orchard.harnesses.headless import HeadlessCliAdapter
from orchard.harnesses.json_lines import json_objects
from orchard.sandbox import Sandbox

CLAUDE_CODE_VERSION = "2.1.332"
"""The Claude Code version ``infra/local/install_harnesses.sh`` installs and this adapter was checked against."""
PROJECT_INSTALL = Path(".orchard/harnesses/claude-code/node_modules/.bin/claude")
"""Where ``infra/local/install_harnesses.sh`` puts the executable, relative to the repository root."""
TOKEN_ENV = "ANTHROPIC_AUTH_TOKEN"  # noqa: S105 - the variable's name, not a secret
CONFIG_DIR = "config"
POLICY_CAPABILITIES = "-mid_conv_system,-mid_conv_tool_change"
"""What a policy model lacks of the newest Claude models' capabilities (``CLAUDE_CODE_MODEL_CAPABILITIES``)."""
QUIET = (
    "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING", "DISABLE_AUTOUPDATER", "DISABLE_BUG_COMMAND",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY", "DISABLE_COST_WARNINGS",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE", "IS_SANDBOX",
)  # fmt: skip
"""Variables set to ``1``: no telemetry, error reports, update checks, surveys; permissions bypassed in a sandbox."""


def find_claude() -> str:
    """The executable: ``$ORCHARD_CLAUDE_CODE_BIN``, the project-local install, or ``claude`` on ``PATH``."""
    return find_npm_harness(
        "claude",
        "ORCHARD_CLAUDE_CODE_BIN",
        PROJECT_INSTALL,
        f"Claude Code (npm @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION})",
    )


def anthropic_base_url(base_url: str) -> str:
    """``ANTHROPIC_BASE_URL`` for an endpoint's base URL: Claude Code appends ``/v1/messages`` itself.

    >>> anthropic_base_url("http://127.0.0.1:9000/v1"), anthropic_base_url("http://proxy/orchard")
    ('http://127.0.0.1:9000', 'http://proxy/orchard')
    """
    return base_url.removesuffix("/v1")


class ClaudeCodeAdapter(HeadlessCliAdapter):
    """Runs ``claude -p`` with the proxy as its Anthropic API, its output as ``stream-json`` events."""

    name = "claude-code"
    token_env = TOKEN_ENV  # sent by Claude Code as Authorization: Bearer

    def __init__(
        self,
        executable: str | None = None,
        capabilities: str = POLICY_CAPABILITIES,
        experimental_betas: bool = False,
        max_output_tokens: int | None = None,
        max_retries: int | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``executable``: the ``claude`` command inside the sandbox (default: ``find_claude()``). ``capabilities``:
        ``CLAUDE_CODE_MODEL_CAPABILITIES`` (``""`` leaves Claude Code's own guess). ``experimental_betas``: keep
        Claude Code's experimental API betas. ``max_output_tokens``: ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` (its default
        is 32,000, more than a small policy's context may hold). ``max_retries``: ``CLAUDE_CODE_MAX_RETRIES`` (its
        default, 10, with backoff, spends minutes on an answer that cannot change, such as a revoked token's 401).
        ``extra_env``: more variables for the command, e.g.
        ``{"CLAUDE_CODE_AUTO_COMPACT_WINDOW": "32768"}`` (no secrets: they would be in the argv)."""
        if max_output_tokens is not None and max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be positive, got {max_output_tokens}")
        if max_retries is not None and max_retries < 0:
            raise ValueError(f"max_retries must not be negative, got {max_retries}")
        self.executable = executable or find_claude()
        self.capabilities = capabilities
        self.experimental_betas = experimental_betas
        self.max_output_tokens = max_output_tokens
        self.max_retries = max_retries
        self.extra_env = dict(extra_env or {})

    def settings_env(self, endpoint: ModelEndpoint) -> dict[str, str]:
        """The command's configuration variables (no secrets: the token travels in ``environment()``)."""
        model = endpoint.model
        env = {
            "ANTHROPIC_BASE_URL": anthropic_base_url(endpoint.base_url),
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            **dict.fromkeys(QUIET, "1"),
        }
        if self.capabilities:
            env["CLAUDE_CODE_MODEL_CAPABILITIES"] = self.capabilities
        if not self.experimental_betas:
            env["CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS"] = "1"
        if self.max_output_tokens is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.max_output_tokens)
        if self.max_retries is not None:
            env["CLAUDE_CODE_MAX_RETRIES"] = str(self.max_retries)
        return env | self.extra_env

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``claude -p`` headless, the task file on stdin, ``stream-json`` events into ``events.jsonl``."""
        argv: list[ShellArg] = [
            self.executable, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
            "--model", endpoint.model, "--max-turns", str(task.max_steps),
        ]  # fmt: skip
        exports: dict[str, ShellArg] = {"CLAUDE_CONFIG_DIR": self.state(CONFIG_DIR), **self.settings_env(endpoint)}
        return self.headless_command(argv, exports)

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """The event stream and session transcripts, how the run ended, its result text, the working copy's patch."""
        output = self.collect_output(sandbox, task, f"{CONFIG_DIR}/projects", ".jsonl")
        result = result_event(output.events)
        message = result.get("result") if result else None
        return HarnessArtifacts(
            harness=self.name,
            exit_status=exit_status(result),
            final_message=message if isinstance(message, str) else None,
            trajectory=self.events_trajectory(output) | output.files,
            patch=output.patch,
            changed_files=output.changed_files,
        )


def result_event(events: str) -> dict[str, Any] | None:
    """The last ``{"type": "result"}`` event of a ``stream-json`` output (lines that are not JSON are skipped).

    >>> result_event('{"type":"system"}\\nnoise\\n{"type":"result","subtype":"success","is_error":false}\\n')
    {'type': 'result', 'subtype': 'success', 'is_error': False}
    """
    results = [event for event in json_objects(events) if event.get("type") == "result"]
    return results[-1] if results else None


def exit_status(result: Mapping[str, Any] | None) -> str | None:
    """How Claude Code says the run ended: its result's ``subtype``, ``error`` when it flags an error as a success.

    >>> exit_status({"subtype": "success", "is_error": False}), exit_status({"subtype": "success", "is_error": True})
    ('success', 'error')
    >>> exit_status({"subtype": "error_max_turns", "is_error": True}), exit_status(None)
    ('error_max_turns', None)
    """
    if result is None:
        return None
    subtype = str(result.get("subtype") or "unknown")
    return "error" if result.get("is_error") and subtype == "success" else subtype
