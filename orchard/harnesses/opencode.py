"""Adapter of opencode (npm ``opencode-ai``), run headless with ``opencode run``.

How it is run (checked against opencode 1.18.33)::

    XDG_CONFIG_HOME=~/.orchard/harness/opencode/config XDG_DATA_HOME=~/.orchard/harness/opencode/data \
    XDG_CACHE_HOME=... XDG_STATE_HOME=... OPENCODE_CONFIG=~/.orchard/harness/opencode/opencode.json \
    ORCHARD_API_KEY=<token> OPENCODE_DISABLE_AUTOUPDATE=1 ... (the variables of ``QUIET``) \
    opencode run --pure --format json --title "<title>" -m orchard/<model> \
        < ~/.orchard/harness/opencode/task.md > ~/.orchard/harness/opencode/events.jsonl

with ``opencode.json``::

    {"$schema": "https://opencode.ai/config.json", "model": "orchard/<model>", "small_model": "orchard/<model>",
     "autoupdate": false, "share": "disabled", "permission": "allow",
     "agent": {"build": {"steps": <max_steps>}},
     "provider": {"orchard": {"npm": "@ai-sdk/openai-compatible", "name": "Orchard proxy",
                              "options": {"baseURL": "<proxy>/v1", "apiKey": "{env:ORCHARD_API_KEY}"},
                              "models": {"<model>": {"name": "<model>", "limit": {"context": ..., "output": ...}}}}}}

What was found, and why each setting:

- opencode speaks chat completions, streamed (``POST {baseURL}/chat/completions``, ``stream_options``), through the
  AI SDK's OpenAI-compatible provider (bundled: nothing is installed at run time); the key is the config's
  ``{env:ORCHARD_API_KEY}``, sent as a Bearer token, so the token is in no file. The tools it offers are its own:
  ``bash`` (``{"command", "description"}``), ``read`` / ``edit`` / ``write`` (``{"filePath", ...}``), ``glob``,
  ``grep``, ``task``, ``todowrite``, ``webfetch``, ``skill``. A reply without tool calls ends the run.
- The task is the message, verbatim, on stdin from the task file: ``opencode run`` wraps a message argument that
  holds a space in double quotes (escaping the quotes inside), and reads stdin when it is not a terminal.
- ``--title``: without a title, opencode first asks the small model for one (a call without tools that is not the
  agent's); a given title skips it. ``--pure``: no external plugins. ``permission: "allow"``: nobody is there to
  approve a command (Orchard's sandbox isolates the run). ``agent.build.steps`` = ``task.max_steps``: opencode's
  own limit of agentic iterations, which is only a request to the model: from that step on every request ends
  with its "maximum steps reached, respond with text only" message, but tool calls still run, and the run goes on
  until the model answers without tool calls (the proxy or the sandbox's ``task.timeout_s`` bounds it).
- The XDG directories and ``OPENCODE_CONFIG`` point into the sandbox's home, so config, the session database
  (``data/opencode/opencode.db``), snapshots and logs are per episode; nothing of a host ``~/.config/opencode`` is
  read. A project's own ``opencode.json`` in the working copy still applies, as in deployment.
- No update checks, model-list fetches (models.dev), LSP downloads, sharing or default plugins
  (``OPENCODE_DISABLE_AUTOUPDATE``, ``OPENCODE_DISABLE_MODELS_FETCH``, ``OPENCODE_DISABLE_LSP_DOWNLOAD``,
  ``OPENCODE_DISABLE_SHARE``, ``OPENCODE_DISABLE_DEFAULT_PLUGINS``, ``OPENCODE_DISABLE_TERMINAL_TITLE``).

How it ended is read from its own output (``--format json``: one event per line), not the exit status: an
``error`` event makes ``exit_status`` the error's name (``APIError``, ...); otherwise it is the ``reason`` of the
last ``step_finish`` (``stop``, ``tool-calls``, ``length``, ...), None when there is none. The final message is the
last ``text`` event's text. Artifacts: the events (``events.jsonl``), opencode's log, and the working copy's patch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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

OPENCODE_VERSION = "1.18.33"
"""The opencode version ``infra/local/install_harnesses.sh`` installs and this adapter was checked against."""
PROJECT_INSTALL = Path(".orchard/harnesses/opencode/node_modules/.bin/opencode")
"""Where ``infra/local/install_harnesses.sh`` puts the executable, relative to the repository root."""
API_KEY_ENV = "ORCHARD_API_KEY"
PROVIDER_ID = "orchard"
CONFIG_FILE = "opencode.json"
XDG = {"XDG_CONFIG_HOME": "config", "XDG_DATA_HOME": "data", "XDG_CACHE_HOME": "cache", "XDG_STATE_HOME": "state"}
QUIET = (
    "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_LSP_DOWNLOAD",
    "OPENCODE_DISABLE_SHARE", "OPENCODE_DISABLE_DEFAULT_PLUGINS", "OPENCODE_DISABLE_TERMINAL_TITLE",
)  # fmt: skip
"""Variables set to ``1``: no update checks, model-list fetches, LSP downloads, sharing, default plugins."""
TITLE = "Orchard episode"


def find_opencode() -> str:
    """The executable: ``$ORCHARD_OPENCODE_BIN``, the project-local install, or ``opencode`` on ``PATH``."""
    return find_npm_harness(
        "opencode", "ORCHARD_OPENCODE_BIN", PROJECT_INSTALL, f"opencode (npm opencode-ai@{OPENCODE_VERSION})"
    )


class OpencodeAdapter(HeadlessCliAdapter):
    """Runs ``opencode run`` with a custom OpenAI-compatible provider whose base URL is the endpoint."""

    name = "opencode"
    token_env = API_KEY_ENV  # read by the provider's {env:ORCHARD_API_KEY}

    def __init__(
        self,
        executable: str | None = None,
        context_tokens: int = 131072,
        output_tokens: int = 4096,
        extra_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``executable``: the ``opencode`` command inside the sandbox (default: ``find_opencode()``).
        ``context_tokens`` / ``output_tokens``: the model's ``limit`` opencode plans its context and replies with.
        ``extra_config``: merged into ``opencode.json`` (mappings merge key by key), e.g. ``{"agent": {"build":
        {"temperature": 0.7}}}``."""
        check_token_limits(context_tokens, output_tokens)
        self.executable = executable or find_opencode()
        self.context_tokens, self.output_tokens = context_tokens, output_tokens
        self.extra_config = dict(extra_config or {})

    def config(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, Any]:
        """``opencode.json`` as a mapping (no secrets: the key is read from ``ORCHARD_API_KEY``)."""
        model = endpoint.model
        limit = {"context": self.context_tokens, "output": self.output_tokens}
        provider = {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Orchard proxy",
            "options": {"baseURL": endpoint.base_url, "apiKey": f"{{env:{API_KEY_ENV}}}"},
            "models": {model: {"name": model, "limit": limit}},
        }
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": f"{PROVIDER_ID}/{model}",
            "small_model": f"{PROVIDER_ID}/{model}",
            "autoupdate": False,
            "share": "disabled",
            "permission": "allow",
            "agent": {"build": {"steps": task.max_steps}},
            "provider": {PROVIDER_ID: provider},
        }
        return merge_config(config, self.extra_config)

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write ``opencode.json`` and the task text."""
        write_state_file(sandbox, self.state(CONFIG_FILE), json.dumps(self.config(endpoint, task), indent=2))
        super().prepare(sandbox, endpoint, task)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``opencode run`` headless, the task file on stdin, JSON events into ``events.jsonl``."""
        argv: list[ShellArg] = [
            self.executable, "run", "--pure", "--format", "json", "--title", TITLE,
            "-m", f"{PROVIDER_ID}/{endpoint.model}",
        ]  # fmt: skip
        exports: dict[str, ShellArg] = {key: self.state(sub) for key, sub in XDG.items()}
        exports |= {"OPENCODE_CONFIG": self.state(CONFIG_FILE), **dict.fromkeys(QUIET, "1")}
        return self.headless_command(argv, exports)

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """The events, how the run ended, the last text, opencode's log and the working copy's patch."""
        output = self.collect_output(sandbox, task, "data/opencode/log", ".log")
        parsed = parse_events(output.events)
        return HarnessArtifacts(
            harness=self.name,
            exit_status=run_status(parsed),
            final_message=last_text(parsed),
            trajectory=self.events_trajectory(output),
            patch=output.patch,
            changed_files=output.changed_files,
            logs=output.files,
        )


def parse_events(events: str) -> list[dict[str, Any]]:
    """The JSON objects of a ``--format json`` output, one a line (other lines skipped)."""
    return list(json_objects(events))


def run_status(events: list[dict[str, Any]]) -> str | None:
    """How opencode says the run ended: an error event's name, else the last step's finish reason.

    >>> run_status([{"type": "step_finish", "part": {"reason": "tool-calls"}}, {"type": "step_finish",
    ...             "part": {"reason": "stop"}}]), run_status([{"type": "error", "error": {"name": "APIError"}}])
    ('stop', 'APIError')
    >>> run_status([{"type": "step_start"}]) is None
    True
    """
    errors = [event for event in events if event.get("type") == "error"]
    if errors:
        error = errors[-1].get("error")
        return str(error.get("name") or "error") if isinstance(error, dict) else "error"
    reasons = [_part(event).get("reason") for event in events if event.get("type") == "step_finish"]
    return str(reasons[-1]) if reasons and reasons[-1] is not None else None


def last_text(events: list[dict[str, Any]]) -> str | None:
    """The text of the last ``text`` event (the agent's last message), None without one."""
    texts = [_part(event).get("text") for event in events if event.get("type") == "text"]
    return texts[-1] if texts and isinstance(texts[-1], str) else None


def _part(event: Mapping[str, Any]) -> dict[str, Any]:
    part = event.get("part")
    return part if isinstance(part, dict) else {}
