"""The Claw agent: a tool-calling personal assistant over the Claw services, run inside the episode's sandbox.

Run (in the task's working copy, which holds ``.claw/seed.json``)::

    OPENAI_API_KEY=<proxy token> python -m recipes.claw.agent \
        --base-url http://127.0.0.1:9000/v1 --model policy --task-file task.md --max-steps 30

It starts the services (``python -m recipes.claw.services`` on a free loopback port) as a child process, offers the
model every service tool (``recipes.claw.tools``) plus ``submit``, runs each tool call as an HTTP request against the
services, and stops the services when it ends. Everything else is the built-in agent's
(``orchard.harnesses.builtin_agent``): the loop, retries, limits, statuses and exit codes, and the trajectory JSONL
(``start``, ``model_call``, ``tool_result`` with the tool's name, arguments and answer, ``end``). Standard library
and ``orchard.harnesses.builtin_agent`` only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.harnesses.builtin_agent import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    SUBMIT_TOOL,
    Agent,
    AgentConfig,
    ChatClient,
    ModelError,
    Outcome,
    Trajectory,
    _progress,
    parse_args,
    truncate_middle,
)
from recipes.claw.tools import call_tool, openai_tools

SYSTEM_PROMPT = """You are a personal assistant acting for {name} <{email}>. It is now {now}.
You manage their calendar, mail, contacts, task list and files with the tools you are given; nothing else is
reachable. Look things up before you change them, change only what the task asks for, and never delete or alter
unrelated records. When the task is done, call `submit` with a one-line summary. Do not ask the user questions."""
SERVICES_START_TIMEOUT_S = 30.0


class Services:
    """The Claw services as a child process serving the working copy."""

    def __init__(self, workdir: Path, python: str = sys.executable) -> None:
        self.process = subprocess.Popen(  # noqa: S603 - our own module, with this interpreter
            [python, "-P", "-m", "recipes.claw.services", "--workdir", str(workdir), "--port", "0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.process.stdout.readline() if self.process.stdout else ""
        try:
            self.url: str = json.loads(line)["url"]
        except (ValueError, KeyError, TypeError):
            self.close()
            raise RuntimeError(f"the Claw services did not start (first line {line!r})") from None

    def close(self) -> None:
        """Stop the services (they have saved every change already)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class ClawChatClient(ChatClient):
    """The built-in agent's chat client (its retries and limits), offering the Claw tools instead of ``shell``."""

    def __init__(self, config: AgentConfig, tools: list[dict[str, Any]]) -> None:
        super().__init__(config)
        self.tools = tools


class ClawAgent(Agent):
    """The built-in agent's loop with the service tools executed against the services' HTTP API."""

    def __init__(self, config: AgentConfig, client: ClawChatClient, trajectory: Trajectory, services_url: str) -> None:
        super().__init__(config, client, trajectory)
        self.services_url = services_url
        self.tool_names = [tool["function"]["name"] for tool in client.tools]
        _, world = call_tool(services_url, "world_info", {})
        user = world.get("user", {}) if isinstance(world, dict) else {}
        prompt = SYSTEM_PROMPT.format(
            name=user.get("name", "the user"), email=user.get("email", "?"), now=world.get("now", "unknown")
        )
        self.messages[0] = {"role": "system", "content": prompt}

    def run(self) -> Outcome:
        """Run to the end (the ``start`` record names the Claw tools)."""
        self.trajectory.write(
            "start",
            model=self.config.model,
            task=self.config.task,
            max_steps=self.config.max_steps,
            tools=self.tool_names,
            services_url=self.services_url,
        )
        for step in range(1, self.config.max_steps + 1):
            if time.monotonic() >= self.deadline:
                return Outcome("timeout", step - 1)
            try:
                outcome = self.step(step)
            except ModelError as exc:
                return Outcome("error", step, error=str(exc))
            if outcome is not None:
                return outcome
        return Outcome("max_steps", self.config.max_steps)

    def call_tool(self, step: int, call: dict[str, Any]) -> str | None:
        """Run one tool call against the services; the summary when it was ``submit``."""
        function = call.get("function") or {}
        name, raw_arguments = function.get("name"), function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw_arguments)
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            self._reply(step, call, name, {"error": f"invalid arguments: {exc}"})
            return None
        if name == "submit":
            self._reply(step, call, name, {"status": "submitted"})
            return str(arguments.get("summary", ""))
        if name not in self.tool_names:
            self._reply(step, call, name, {"error": f"unknown tool {name!r}"})
            return None
        timeout = max(1.0, min(self.config.command_timeout_s, self.deadline - time.monotonic()))
        started = time.perf_counter()
        ok, answer = call_tool(self.services_url, name, arguments, timeout_s=timeout)
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        rendered, limit = json.dumps(answer, ensure_ascii=False), self.config.max_output_chars
        result = {"ok": ok, "result": answer if len(rendered) <= limit else truncate_middle(rendered, limit)}
        self._reply(step, call, name, result, duration_ms=duration_ms)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one episode in the current directory; exit codes as the built-in agent's."""
    try:
        config = parse_args(argv)
    except (OSError, ValueError) as exc:
        _progress("bad_arguments", error=str(exc))
        return EXIT_USAGE
    trajectory = Trajectory(config.trajectory)
    try:
        services = Services(Path.cwd())
    except (OSError, RuntimeError) as exc:
        trajectory.write("end", status="error", steps=0, submission=None, error=str(exc))
        trajectory.close()
        _progress("end", status="error", steps=0, error=str(exc))
        return EXIT_ERROR
    client = ClawChatClient(config, [*openai_tools(), SUBMIT_TOOL])
    try:
        outcome = ClawAgent(config, client, trajectory, services.url).run()
        trajectory.write(
            "end", status=outcome.status, steps=outcome.steps, submission=outcome.submission, error=outcome.error
        )
    finally:
        client.close()
        services.close()
        trajectory.close()
    _progress("end", status=outcome.status, steps=outcome.steps, error=outcome.error)
    return EXIT_ERROR if outcome.status == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
