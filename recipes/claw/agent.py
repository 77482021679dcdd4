"""The Claw agent: a tool-calling personal assistant over the Claw services, run inside the episode's sandbox.

Run (in the task's working copy, which holds ``.claw/seed.json``)::

    OPENAI_API_KEY=<proxy token> python -m recipes.claw.agent \
        --base-url http://127.0.0.1:9000/v1 --model policy --task-file task.md --max-steps 30

It starts the services (``python -m recipes.claw.services`` on a free loopback port) as a child process, offers the
model every service tool (``recipes.claw.tools``) plus ``submit``, runs each tool call as an HTTP request against the
services, and stops the services when it ends. Everything else is the built-in agent's
(``orchard.harnesses.builtin_agent``, run with this module's tool executor, system prompt and services): the
command line, the loop, retries, limits, statuses and exit codes, and the trajectory JSONL (``start``, with the
services' URL, ``model_call``, ``tool_result`` with the tool's name, arguments and answer, ``end``). Standard
library and ``orchard.harnesses.builtin_agent`` only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchard.harnesses import builtin_agent
from orchard.harnesses.builtin_agent import SUBMIT_TOOL, Agent, AgentConfig, ChatClient, Trajectory, truncate_middle
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


class ServiceTools:
    """The Claw agent's tool executor (see ``builtin_agent.ShellTool``): every service tool, run as an HTTP request
    against the services; the answer is cut in the middle to ``max_output_chars`` when its JSON is longer."""

    def __init__(self, services_url: str, max_output_chars: int) -> None:
        self.services_url, self.max_output_chars = services_url, max_output_chars
        self.tools: list[dict[str, Any]] = [*openai_tools(), SUBMIT_TOOL]
        self.names = [tool["function"]["name"] for tool in self.tools]

    def refusal(self, name: Any, arguments: dict[str, Any]) -> str | None:
        """An error for a tool the model was not offered."""
        return None if name in self.names else f"unknown tool {name!r}"

    def run(self, name: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Whether the services accepted the call, and their answer."""
        ok, answer = call_tool(self.services_url, name, arguments, timeout_s=timeout_s)
        rendered, limit = json.dumps(answer, ensure_ascii=False), self.max_output_chars
        return {"ok": ok, "result": answer if len(rendered) <= limit else truncate_middle(rendered, limit)}


def system_prompt(services_url: str) -> str:
    """The system prompt, naming the user and the time of the services' world."""
    _, world = call_tool(services_url, "world_info", {})
    user = world.get("user", {}) if isinstance(world, dict) else {}
    return SYSTEM_PROMPT.format(
        name=user.get("name", "the user"), email=user.get("email", "?"), now=world.get("now", "unknown")
    )


def open_claw_agent(config: AgentConfig, trajectory: Trajectory, closing: list[Any]) -> Agent:
    """The built-in agent's loop over the Claw tools, with the services started in the working directory."""
    services = Services(Path.cwd())
    closing.append(services)
    tools = ServiceTools(services.url, config.max_output_chars)
    client = ChatClient(config, tools.tools)
    closing.append(client)
    prompt = system_prompt(services.url)
    return Agent(config, client, trajectory, tools, prompt, start_fields={"services_url": services.url})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one episode in the current directory; exit codes as the built-in agent's."""
    return builtin_agent.main(argv, open_claw_agent)


if __name__ == "__main__":
    sys.exit(main())
