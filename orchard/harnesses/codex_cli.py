"""Adapter of OpenAI's Codex CLI (npm ``@openai/codex``), run headless with ``codex exec`` against the proxy.

How it is run (checked against Codex CLI 0.169.0)::

    CODEX_HOME=~/.orchard/harness/codex/home ORCHARD_API_KEY=<token> \
    codex exec --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox --color never --json \
        -o ~/.orchard/harness/codex/last_message.txt "<task>"

with ``$CODEX_HOME/config.toml``::

    model = "<model>"
    model_provider = "orchard"
    approval_policy = "never"
    sandbox_mode = "danger-full-access"
    check_for_update_on_startup = false
    web_search = "disabled"

    [analytics]
    enabled = false

    [feedback]
    enabled = false

    [model_providers.orchard]
    name = "Orchard proxy"
    base_url = "<proxy>/v1"          # Codex appends /responses
    env_key = "ORCHARD_API_KEY"      # the variable holding the per-episode token (sent as a Bearer token)
    wire_api = "responses"           # the only value 0.169 accepts ("chat" is rejected at startup)

What was found, and why each setting:

- Codex speaks only the Responses API, streamed (``POST {base_url}/responses``, ``stream: true``,
  ``store: false``); the proxy must serve ``/v1/responses`` with SSE. With the model's metadata unknown to Codex
  (any policy name), it uses its fallback model profile and warns; the tools it offers the model are then
  ``exec_command`` (``{"cmd": "..."}``, run with ``/bin/bash -lc``), ``write_stdin``, ``request_user_input``,
  ``view_image``, the ``multi_agent_v1`` namespace and the goal tools. No login is needed: a custom provider with
  ``env_key`` authenticates with that variable only.
- ``CODEX_HOME`` points into the sandbox's home, so config, sessions and its SQLite state are per episode; nothing
  of the host's ``~/.codex`` is read.
- The sandbox is Orchard's: ``--dangerously-bypass-approvals-and-sandbox`` (Codex's own bubblewrap/landlock sandbox
  needs namespaces that an Orchard sandbox does not grant), ``approval_policy = "never"`` so it never waits for a
  human. ``sandbox="workspace-write"`` instead uses ``-s workspace-write`` where Codex's own sandbox works.
- ``--skip-git-repo-check``: task copies need not be git repositories. stdin is empty (``run_harness`` passes
  ``b""``): with a piped stdin Codex appends it to the prompt, and an open stdin would block it.
- Codex has no step limit: ``task.max_steps`` is not enforced by Codex (the proxy and ``task.timeout_s`` bound the
  run).
- Web search (a hosted OpenAI tool), analytics, feedback upload and the update check are off; the sandbox has no
  network besides the proxy anyway. Codex 0.169 still resolves github.com, api.github.com and chatgpt.com at startup
  (plugin and app discovery); without network those lookups fail and the run goes on.

Artifacts: the session rollout (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``: every Responses item, token
counts, and the ``task_complete`` event), the last agent message (``-o``), the ``--json`` event stream on stdout
(``run_harness`` puts it in the logs), and the working copy's patch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from orchard.harnesses.base import (
    FileText,
    HarnessAdapter,
    HarnessArtifacts,
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    collect_changes,
    find_npm_harness,
    list_state_files,
    merge_config,
    read_state_file,
    shell_command,
    write_state_file,
)
from orchard.harnesses.json_lines import json_objects
from orchard.sandbox import Sandbox

CODEX_VERSION = "0.169.0"
"""The Codex CLI version ``infra/local/install_harnesses.sh`` installs and this adapter was checked against."""
PROJECT_INSTALL = Path(".orchard/harnesses/codex/node_modules/.bin/codex")
"""Where ``infra/local/install_harnesses.sh`` puts the executable, relative to the repository root."""
API_KEY_ENV = "ORCHARD_API_KEY"
PROVIDER_ID = "orchard"
HOME_DIR = "home"
TASK_FILE = "task.md"
LAST_MESSAGE_FILE = "last_message.txt"
END_EVENTS = frozenset({"task_complete", "turn_aborted", "error", "stream_error"})

CodexSandbox = Literal["none", "workspace-write", "read-only"]


def find_codex() -> str:
    """The Codex CLI executable: ``$ORCHARD_CODEX_BIN``, the project-local install, or ``codex`` on ``PATH``."""
    return find_npm_harness(
        "codex", "ORCHARD_CODEX_BIN", PROJECT_INSTALL, f"Codex CLI (npm @openai/codex@{CODEX_VERSION})"
    )


class CodexCliAdapter(HarnessAdapter):
    """Runs ``codex exec`` with a custom model provider whose base URL is the endpoint."""

    name = "codex"

    def __init__(
        self,
        executable: str | None = None,
        sandbox: CodexSandbox = "none",
        reasoning_effort: str | None = None,
        extra_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``executable``: the ``codex`` command inside the sandbox (default: ``find_codex()``). ``sandbox``: Codex's
        own sandbox (``none`` bypasses it and approvals; Orchard's sandbox isolates the run). ``reasoning_effort``:
        ``model_reasoning_effort``. ``extra_config``: merged into ``config.toml`` (tables merge key by key), e.g.
        ``{"model_context_window": 32768}`` or provider retry settings."""
        self.executable = executable or find_codex()
        self.sandbox = sandbox
        self.reasoning_effort = reasoning_effort
        self.extra_config = dict(extra_config or {})

    def config(self, endpoint: ModelEndpoint) -> dict[str, Any]:
        """``config.toml`` as a mapping (no secrets: the key is read from ``ORCHARD_API_KEY``)."""
        config: dict[str, Any] = {
            "model": endpoint.model,
            "model_provider": PROVIDER_ID,
            "approval_policy": "never",
            "sandbox_mode": "danger-full-access" if self.sandbox == "none" else self.sandbox,
            "check_for_update_on_startup": False,
            "web_search": "disabled",
            "analytics": {"enabled": False},
            "feedback": {"enabled": False},
            "model_providers": {
                PROVIDER_ID: {
                    "name": "Orchard proxy",
                    "base_url": endpoint.base_url,
                    "env_key": API_KEY_ENV,
                    "wire_api": "responses",
                }
            },
        }
        if self.reasoning_effort is not None:
            config["model_reasoning_effort"] = self.reasoning_effort
        return merge_config(config, self.extra_config)

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write ``$CODEX_HOME/config.toml`` and the task text."""
        write_state_file(sandbox, self.state(f"{HOME_DIR}/config.toml"), to_toml(self.config(endpoint)))
        write_state_file(sandbox, self.state(TASK_FILE), task.instruction)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``codex exec`` headless, JSON events on stdout, the task text as the prompt."""
        isolation = ["--dangerously-bypass-approvals-and-sandbox"] if self.sandbox == "none" else ["-s", self.sandbox]
        argv: list[ShellArg] = [
            self.executable, "exec", "--skip-git-repo-check", *isolation, "--color", "never", "--json",
            "-o", self.state(LAST_MESSAGE_FILE),
            FileText(self.state(TASK_FILE)),
        ]  # fmt: skip
        return shell_command(argv, exports={"CODEX_HOME": self.state(HOME_DIR)})

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """The proxy token under the provider's ``env_key``."""
        return {API_KEY_ENV: endpoint.api_key.get_secret_value()}

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """Session rollouts, the last agent message, how the task ended, and the working copy's patch."""
        trajectory: dict[str, str] = {}
        for relpath in list_state_files(sandbox, self.name, f"{HOME_DIR}/sessions", ".jsonl"):
            text = read_state_file(sandbox, self.name, relpath)
            if text is not None:
                trajectory[self.state(relpath).display()] = text
        last_message = read_state_file(sandbox, self.name, LAST_MESSAGE_FILE)
        patch, changed = collect_changes(sandbox, task.workdir)
        return HarnessArtifacts(
            harness=self.name,
            exit_status=_end_event(trajectory.values()),
            final_message=last_message,
            trajectory=trajectory,
            patch=patch,
            changed_files=changed,
        )


def _end_event(rollouts: Iterable[str]) -> str | None:
    """The type of the last end-of-task event (``task_complete``, ``turn_aborted``, ``error``) in the rollouts."""
    found: str | None = None
    for text in rollouts:
        for record in json_objects(text):
            payload = record.get("payload")
            if record.get("type") == "event_msg" and isinstance(payload, dict) and payload.get("type") in END_EVENTS:
                found = payload["type"]
    return found


# ---------------------------------------------------------------------------------------------------- TOML
def to_toml(config: Mapping[str, Any]) -> str:
    """A TOML document for a mapping of scalars, lists of scalars and nested mappings (tables).

    >>> print(to_toml({"model": "m", "n": 1, "ok": True, "provider": {"a": {"url": "http://x"}}}), end="")
    model = "m"
    n = 1
    ok = true
    <BLANKLINE>
    [provider.a]
    url = "http://x"
    """
    return "".join(_toml_table(config, ()))


def _toml_table(table: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    scalars = [(key, value) for key, value in table.items() if not isinstance(value, Mapping)]
    tables = [(key, value) for key, value in table.items() if isinstance(value, Mapping)]
    lines: list[str] = []
    if path and (scalars or not tables):
        lines.append(f"\n[{'.'.join(_toml_key(part) for part in path)}]\n")
    lines += [f"{_toml_key(key)} = {_toml_value(value)}\n" for key, value in scalars]
    for key, value in tables:
        lines += _toml_table(value, (*path, key))
    return lines


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a TOML basic string, once DEL (a control character to TOML, not to JSON) is escaped
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")
