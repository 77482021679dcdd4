"""Adapter of pi (npm ``@mariozechner/pi-coding-agent``), run headless with ``pi -p --mode json``.

How it is run (checked against pi 0.73.1 on Node 20.20)::

    PI_CODING_AGENT_DIR=~/.orchard/harness/pi/agent ORCHARD_API_KEY=<token> PI_OFFLINE=1 PI_TELEMETRY=0 \
    PI_SKIP_VERSION_CHECK=1 \
    pi -p --mode json --provider orchard --model <model> --session-dir ~/.orchard/harness/pi/sessions \
        < ~/.orchard/harness/pi/task.md > ~/.orchard/harness/pi/events.jsonl

with ``$PI_CODING_AGENT_DIR/models.json``::

    {"providers": {"orchard": {"baseUrl": "<proxy>/v1", "api": "openai-completions", "apiKey": "ORCHARD_API_KEY",
                               "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                               "models": [{"id": "<model>", "contextWindow": ..., "maxTokens": ...}]}}}

and ``settings.json``: ``{"defaultProvider": "orchard", "defaultModel": "<model>", "enableInstallTelemetry": false,
"quietStartup": true}``.

What was found, and why each setting:

- pi speaks chat completions, streamed (``api: "openai-completions"``; ``"openai-responses"`` works too, with the
  ``api`` option), with ``max_completion_tokens``, ``store: false`` and ``stream_options``. A provider's ``apiKey``
  that names an environment variable is read from it, so the token is in no file; it is sent as a Bearer token.
  ``compat`` keeps the system prompt a ``system`` message (no ``developer`` role) and sends no
  ``reasoning_effort``, which a served policy does not take. Its tools: ``read`` (``{"path", "offset", "limit"}``,
  relative paths allowed), ``bash`` (``{"command", "timeout"}``), ``edit`` (``{"path", "edits"}``), ``write``
  (``{"path", "content"}``). A reply without tool calls ends the run.
- ``PI_CODING_AGENT_DIR`` points into the sandbox's home: settings, models, auth and extensions are per episode;
  nothing of a host ``~/.pi`` is read. Sessions go to ``--session-dir`` in the state directory (the trajectory).
- No network besides the model: ``PI_OFFLINE=1`` (no update, package-update or telemetry requests at start-up),
  ``PI_TELEMETRY=0``, ``PI_SKIP_VERSION_CHECK=1``, ``enableInstallTelemetry: false``.
- The task is the prompt, on stdin from the task file (pi reads piped stdin in print mode and trims it; an argument
  starting with ``@`` would be read as a file to attach).
- pi has no step limit (``task.max_steps`` is not enforced; the proxy or ``task.timeout_s`` bounds the run), and
  its ``bash`` tool has no default timeout. It runs on the sandbox's ``node`` (``#!/usr/bin/env node``, Node >=
  20.6; Debian's ``/usr/bin/node`` is in every local sandbox's view).

How it ended is read from its own output, never the exit status (with ``--mode json`` pi exits 0 after an API
error): the last assistant message of the ``agent_end`` event (else of the last ``message_end``); ``exit_status`` is
its ``stopReason`` (``stop``, ``toolUse``, ``length``, ``error``, ``aborted``), the final message its text, or its
``errorMessage`` when it has none. Artifacts: the events (``events.jsonl``), the session files, the patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from orchard.harnesses.base import (
    HarnessArtifacts,
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    find_npm_harness,
    merge_config,
    write_state_file,
)
from orchard.harnesses.headless import HeadlessCliAdapter, check_token_limits
from orchard.harnesses.json_lines import json_objects
from orchard.sandbox import Sandbox

PI_VERSION = "0.73.1"
"""The pi version ``infra/local/install_harnesses.sh`` installs and this adapter was checked against."""
PROJECT_INSTALL = Path(".orchard/harnesses/pi/node_modules/.bin/pi")
"""Where ``infra/local/install_harnesses.sh`` puts the executable, relative to the repository root."""
API_KEY_ENV = "ORCHARD_API_KEY"
PROVIDER_ID = "orchard"
AGENT_DIR = "agent"
SESSIONS_DIR = "sessions"
QUIET = {"PI_OFFLINE": "1", "PI_TELEMETRY": "0", "PI_SKIP_VERSION_CHECK": "1"}

PiApi = Literal["openai-completions", "openai-responses"]


def find_pi() -> str:
    """The executable: ``$ORCHARD_PI_BIN``, the project-local install, or ``pi`` on ``PATH``."""
    return find_npm_harness(
        "pi", "ORCHARD_PI_BIN", PROJECT_INSTALL, f"pi (npm @mariozechner/pi-coding-agent@{PI_VERSION})"
    )


class PiAdapter(HeadlessCliAdapter):
    """Runs ``pi -p --mode json`` with a custom provider whose base URL is the endpoint."""

    name = "pi"
    token_env = API_KEY_ENV  # the variable the provider's apiKey names

    def __init__(
        self,
        executable: str | None = None,
        api: PiApi = "openai-completions",
        context_tokens: int = 131072,
        output_tokens: int = 4096,
        extra_models: Mapping[str, Any] | None = None,
    ) -> None:
        """``executable``: the ``pi`` command inside the sandbox (default: ``find_pi()``). ``api``: the OpenAI API
        pi speaks. ``context_tokens`` / ``output_tokens``: the model's ``contextWindow`` and ``maxTokens``.
        ``extra_models``: merged into ``models.json`` (mappings merge key by key)."""
        check_token_limits(context_tokens, output_tokens)
        self.executable = executable or find_pi()
        self.api = api
        self.context_tokens, self.output_tokens = context_tokens, output_tokens
        self.extra_models = dict(extra_models or {})

    def models(self, endpoint: ModelEndpoint) -> dict[str, Any]:
        """``models.json`` as a mapping (no secrets: ``apiKey`` names the variable holding the token)."""
        model = {"id": endpoint.model, "contextWindow": self.context_tokens, "maxTokens": self.output_tokens}
        provider = {
            "baseUrl": endpoint.base_url,
            "api": self.api,
            "apiKey": API_KEY_ENV,
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
            "models": [model],
        }
        return merge_config({"providers": {PROVIDER_ID: provider}}, self.extra_models)

    def settings(self, endpoint: ModelEndpoint) -> dict[str, Any]:
        """``settings.json``: the default model, no install telemetry, no start-up banner."""
        return {
            "defaultProvider": PROVIDER_ID,
            "defaultModel": endpoint.model,
            "enableInstallTelemetry": False,
            "quietStartup": True,
        }

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write ``models.json``, ``settings.json`` and the task text."""
        write_state_file(sandbox, self.state(f"{AGENT_DIR}/models.json"), json.dumps(self.models(endpoint), indent=2))
        write_state_file(sandbox, self.state(f"{AGENT_DIR}/settings.json"), json.dumps(self.settings(endpoint)))
        super().prepare(sandbox, endpoint, task)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``pi -p --mode json``, the task file on stdin, the events into ``events.jsonl``."""
        argv: list[ShellArg] = [
            self.executable, "-p", "--mode", "json", "--provider", PROVIDER_ID, "--model", endpoint.model,
            "--session-dir", self.state(SESSIONS_DIR),
        ]  # fmt: skip
        exports: dict[str, ShellArg] = {"PI_CODING_AGENT_DIR": self.state(AGENT_DIR), **QUIET}
        return self.headless_command(argv, exports)

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """The events and sessions, how the run ended, the last message, the working copy's patch."""
        output = self.collect_output(sandbox, task, SESSIONS_DIR, ".jsonl")
        last = last_assistant(output.events)
        return HarnessArtifacts(
            harness=self.name,
            exit_status=str(last["stopReason"]) if last and last.get("stopReason") else None,
            final_message=message_text(last),
            trajectory=self.events_trajectory(output) | output.files,
            patch=output.patch,
            changed_files=output.changed_files,
        )


def last_assistant(events: str) -> dict[str, Any] | None:
    """The run's last assistant message: the last one of the final ``agent_end``, else of the last ``message_end``.

    >>> last_assistant('{"type":"message_end","message":{"role":"assistant","stopReason":"error"}}\\n')
    {'role': 'assistant', 'stopReason': 'error'}
    """
    found: dict[str, Any] | None = None
    for event in json_objects(events):
        messages = event.get("messages") if event.get("type") == "agent_end" else [event.get("message")]
        if event.get("type") in ("agent_end", "message_end") and isinstance(messages, list):
            assistant = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
            found = assistant[-1] if assistant else found
    return found


def message_text(message: Mapping[str, Any] | None) -> str | None:
    """An assistant message's text, or its ``errorMessage`` when it has no text.

    >>> message_text({"content": [{"type": "text", "text": "done"}]})
    'done'
    >>> message_text({"content": [], "errorMessage": "401 Incorrect API key"})
    '401 Incorrect API key'
    """
    if message is None:
        return None
    content = message.get("content")
    parts = [p.get("text") for p in content if isinstance(p, dict)] if isinstance(content, list) else []
    text = "".join(part for part in parts if isinstance(part, str))
    error = message.get("errorMessage")
    return text or (error if isinstance(error, str) else None)
