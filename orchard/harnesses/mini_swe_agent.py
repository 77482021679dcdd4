"""Adapter of mini-swe-agent (PyPI ``mini-swe-agent``, 2.x), run as its own ``mini`` command line, unattended.

How it is run (checked against mini-swe-agent 2.4.6 with litellm 1.97)::

    MSWEA_GLOBAL_CONFIG_DIR=~/.orchard/harness/mini-swe-agent/global OPENAI_API_KEY=<token> \
    python -I -u -m minisweagent.run.mini --yolo --exit-immediately -c mini.yaml \
        -c ~/.orchard/harness/mini-swe-agent/config.yaml -o ~/.orchard/harness/mini-swe-agent/trajectory.json

- ``-I`` (isolated mode): no ``PYTHON*`` variable, user site-packages or working directory decides what is imported,
  so a ``PYTHONPATH`` in the sandbox's environment or a package of the same name in the task's working copy cannot
  replace mini's own code; ``-u``: unbuffered output.

- ``-c mini.yaml`` keeps the harness's own default prompts and templates (a ``-c`` flag replaces the default config,
  so it has to be named); our ``config.yaml`` is merged over it and holds only what Orchard decides: the model, the
  endpoint, the limits and the task.
- The model goes through litellm's OpenAI provider: ``model_name: openai/<model>`` with ``model_kwargs.api_base`` =
  the proxy; the key comes from ``OPENAI_API_KEY``. The model speaks chat completions (not streamed) with one
  ``bash`` tool (``{"command": ...}``); the episode ends when a command's output starts with
  ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``.
- No prompts: ``--yolo`` runs commands without confirmation, ``--exit-immediately`` (``confirm_exit: false``) ends
  without asking for a new task, and the interactive agent stops instead of asking for new limits when stdin is not a
  terminal. ``MSWEA_CONFIGURED`` skips the first-run setup wizard.
- Cost tracking is off (``cost_limit: 0``, ``cost_tracking: ignore_errors``): a policy under training has no price
  in litellm's registry and mini would otherwise abort on the first call. ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps
  litellm from fetching its price list from the network at import.
- ``step_limit`` = ``task.max_steps`` model calls, ``wall_time_limit_seconds`` = ``task.timeout_s``.

The trajectory is mini's JSON (``trajectory_format: mini-swe-agent-1.1``): every message with the raw model
response in ``extra.response``, and ``info.exit_status`` (``Submitted``, ``LimitsExceeded``, ``TimeExceeded``, an
exception name) and ``info.submission``. mini writes it after every step, so a killed run leaves a partial one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import yaml

from orchard.harnesses.base import (
    HarnessAdapter,
    HarnessArtifacts,
    HarnessTask,
    ModelEndpoint,
    ShellArg,
    collect_changes,
    merge_config,
    read_state_file,
    shell_command,
    write_state_file,
)
from orchard.sandbox import Sandbox

CONFIG_FILE = "config.yaml"
TRAJECTORY_FILE = "trajectory.json"
GLOBAL_CONFIG_DIR = "global"
BASE_CONFIG = "mini.yaml"
"""mini-swe-agent's own default config (prompts, templates), looked up in its package."""


class MiniSweAgentAdapter(HarnessAdapter):
    """Runs mini-swe-agent's ``mini`` in yolo mode against the endpoint through litellm's OpenAI provider."""

    name = "mini-swe-agent"

    def __init__(
        self,
        python: str = sys.executable,
        base_config: str = BASE_CONFIG,
        command_timeout_s: int = 60,
        retry_attempts: int = 3,
        agent_class: str = "interactive",
        model_kwargs: Mapping[str, Any] | None = None,
        extra_config: Mapping[str, Any] | None = None,
    ) -> None:
        """``python``: an interpreter with mini-swe-agent installed (default: this one). ``base_config``: mini's
        config the run starts from. ``command_timeout_s``: limit of one bash command. ``retry_attempts``: model
        call attempts before mini gives up. ``agent_class``: ``interactive`` (what ``mini`` runs) or ``default``.
        ``model_kwargs``: extra litellm arguments (temperature, max_tokens...). ``extra_config``: merged last into
        the config file (nested mappings merge)."""
        self.python = python
        self.base_config = base_config
        self.command_timeout_s = command_timeout_s
        self.retry_attempts = retry_attempts
        self.agent_class = agent_class
        self.model_kwargs = dict(model_kwargs or {})
        self.extra_config = dict(extra_config or {})

    def config(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, Any]:
        """The config file merged over ``base_config`` (no secrets: the key travels in the environment)."""
        config: dict[str, Any] = {
            "agent": {
                "agent_class": self.agent_class,
                "mode": "yolo",
                "confirm_exit": False,
                "step_limit": task.max_steps,
                "cost_limit": 0,
                "wall_time_limit_seconds": max(1, int(task.timeout_s)),
            },
            "model": {
                "model_class": "litellm",
                "model_name": f"openai/{endpoint.model}",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {"api_base": endpoint.base_url, "drop_params": True, **self.model_kwargs},
            },
            "environment": {"environment_class": "local", "timeout": self.command_timeout_s},
            "run": {"task": task.instruction},
        }
        return merge_config(config, self.extra_config)

    def prepare(self, sandbox: Sandbox, endpoint: ModelEndpoint, task: HarnessTask) -> None:
        """Write ``config.yaml`` (model, endpoint, limits, task)."""
        text = yaml.safe_dump(self.config(endpoint, task), sort_keys=False, allow_unicode=True)
        write_state_file(sandbox, self.state(CONFIG_FILE), text)

    def command(self, endpoint: ModelEndpoint, task: HarnessTask) -> list[str]:
        """``python -I -u -m minisweagent.run.mini --yolo --exit-immediately -c mini.yaml -c config.yaml -o traj``."""
        argv: list[ShellArg] = [
            self.python, "-I", "-u", "-m", "minisweagent.run.mini", "--yolo", "--exit-immediately",
            "-c", self.base_config,
            "-c", self.state(CONFIG_FILE),
            "-o", self.state(TRAJECTORY_FILE),
        ]  # fmt: skip
        return shell_command(argv, exports={"MSWEA_GLOBAL_CONFIG_DIR": self.state(GLOBAL_CONFIG_DIR)})

    def environment(self, endpoint: ModelEndpoint, task: HarnessTask) -> dict[str, str]:
        """The key, no setup wizard, no banner, no cost tracking, no network fetch of litellm's price list."""
        return {
            "OPENAI_API_KEY": endpoint.api_key.get_secret_value(),
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.retry_attempts),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONUNBUFFERED": "1",
        }

    def collect(self, sandbox: Sandbox, task: HarnessTask) -> HarnessArtifacts:
        """mini's trajectory JSON, its exit status and submission, and the working copy's patch."""
        text = read_state_file(sandbox, self.name, TRAJECTORY_FILE)
        info = _trajectory_info(text)
        patch, changed = collect_changes(sandbox, task.workdir)
        return HarnessArtifacts(
            harness=self.name,
            exit_status=info.get("exit_status") or None,
            final_message=info.get("submission") or None,
            trajectory={} if text is None else {self.state(TRAJECTORY_FILE).display(): text},
            patch=patch,
            changed_files=changed,
        )


def _trajectory_info(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        info = json.loads(text).get("info", {})
    except (ValueError, AttributeError):
        return {}
    return info if isinstance(info, dict) else {}
