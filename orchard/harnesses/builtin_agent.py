"""Orchard's built-in minimal tool-calling agent: a standalone program for tests and the CPU recipe.

Run inside a sandbox as::

    OPENAI_API_KEY=<proxy token> python -m orchard.harnesses.builtin_agent \
        --base-url http://127.0.0.1:9000/v1 --model policy --task-file task.md --max-steps 30

It needs only the standard library and httpx (it runs with whatever interpreter the sandbox has), so it does not use
structlog or pydantic: progress goes to stderr as JSON lines, and the trajectory to a JSONL file.

The loop: a system prompt and the task, then up to ``--max-steps`` chat completions (not streamed) with two tools,
``shell`` (run a command in the working directory with ``/bin/sh -c``; the reply is the exit code and the output,
stdout and stderr merged, truncated in the middle to ``--max-output-chars``) and ``submit`` (end the episode). The
assistant message is appended to the history exactly as returned, then one ``tool`` message per call, in order.

How it ends (the ``status`` of the trajectory's last record, and the exit code):

- ``submitted``: the model called ``submit`` (exit 0); calls after ``submit`` in the same message are not run;
- ``stopped``: the model answered without a tool call (exit 0);
- ``max_steps`` / ``timeout``: the step budget or ``--timeout`` ran out (exit 0: the agent did not crash);
- ``error``: the model API failed after ``--retries`` retries (transport errors, 429 and 5xx are retried with
  backoff; other 4xx are not), or answered with something that is not a chat completion (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

SYSTEM_PROMPT = """You are an autonomous software agent working in a Unix shell.
Use the `shell` tool to run commands in the working directory (each call runs in a fresh `/bin/sh`; state such as
`cd` does not persist between calls). Inspect files before changing them and check your work.
When the task is done, call the `submit` tool with a one-line summary. Do not ask the user questions."""

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in the working directory; returns its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command, run with /bin/sh -c."}},
            "required": ["command"],
        },
    },
}
SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Finish the task. Call this once the work is complete.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "One line on what was done."}},
            "required": [],
        },
    },
}
TOOLS = [SHELL_TOOL, SUBMIT_TOOL]
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class ModelError(RuntimeError):
    """The model API failed for good (after retries, or with a non-retryable answer)."""


@dataclass
class AgentConfig:
    """Command-line settings of one run."""

    base_url: str
    model: str
    task: str
    api_key: str
    max_steps: int = 30
    timeout_s: float = 1800.0
    command_timeout_s: float = 120.0
    max_output_chars: int = 10_000
    request_timeout_s: float = 600.0
    retries: int = 3
    temperature: float | None = None
    max_tokens: int | None = None
    trajectory: Path = Path("trajectory.jsonl")
    extra_body: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------- tools
def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail.

    >>> truncate_middle("abcdefghij", 6)
    'abc\\n[... 4 characters elided ...]\\nhij'
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters elided ...]\n{text[len(text) - tail :]}"


def run_shell(command: str, timeout_s: float, max_output_chars: int) -> tuple[int | None, str]:
    """Run ``command`` with ``/bin/sh -c``; kill its process group at the timeout. Returns (exit code, output)."""
    process = subprocess.Popen(  # noqa: S603 - running the model's command is this tool's purpose
        ["/bin/sh", "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        raw, _ = process.communicate(timeout=timeout_s)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raw, _ = process.communicate()
        code = None
    output = raw.decode("utf-8", errors="replace")
    if code is None:
        output += f"\n[command killed after {timeout_s:g} s]"
    return code, truncate_middle(output, max_output_chars)


# ---------------------------------------------------------------------------------------------------- model
class ChatClient:
    """Chat completions over httpx with retries of transport errors, 429 and 5xx."""

    def __init__(self, config: AgentConfig) -> None:
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.config = config
        self.http = httpx.Client(
            base_url=config.base_url.rstrip("/") + "/", headers=headers, timeout=config.request_timeout_s
        )

    def complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One non-streamed completion with the agent's tools."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": "auto",
            **self.config.extra_body,
        }
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        for attempt in range(self.config.retries + 1):
            last_try = attempt == self.config.retries
            try:
                response = self.http.post("chat/completions", json=body)
            except httpx.TransportError as exc:
                if last_try:
                    raise ModelError(f"model API unreachable: {exc!r}") from exc
            else:
                if response.status_code == 200:
                    return _completion(response)
                if response.status_code not in RETRY_STATUS or last_try:
                    raise ModelError(f"model API answered {response.status_code}: {response.text[:2000]}")
            time.sleep(min(2.0**attempt, 30.0))
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()


def _completion(response: httpx.Response) -> dict[str, Any]:
    try:
        payload = response.json()
        message = payload["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"not a chat completion: {response.text[:2000]}") from exc
    if not isinstance(message, dict):
        raise ModelError(f"not a chat completion message: {message!r}")
    return payload  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------------- loop
class Trajectory:
    """The run's JSONL record, one flushed line per event."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: TextIO = path.open("w", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        """Append one record ``{"event": ..., "time": ..., **fields}``."""
        self.file.write(json.dumps({"event": event, "time": time.time(), **fields}, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


@dataclass
class Outcome:
    """How the loop ended."""

    status: str
    steps: int
    submission: str | None = None
    error: str | None = None


class Agent:
    """The multi-turn loop: ask the model, run its tool calls, repeat until submit, a text answer, or a limit."""

    def __init__(self, config: AgentConfig, client: ChatClient, trajectory: Trajectory) -> None:
        self.config, self.client, self.trajectory = config, client, trajectory
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": config.task},
        ]
        self.deadline = time.monotonic() + config.timeout_s

    def run(self) -> Outcome:
        """Run to the end; never raises for model or tool failures (they become the outcome)."""
        self.trajectory.write(
            "start",
            model=self.config.model,
            task=self.config.task,
            max_steps=self.config.max_steps,
            tools=[tool["function"]["name"] for tool in TOOLS],
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

    def step(self, step: int) -> Outcome | None:
        """One model call and its tool calls; an ``Outcome`` when the episode ends here."""
        started = time.perf_counter()
        payload = self.client.complete(self.messages)
        message = payload["choices"][0]["message"]
        latency_ms = round((time.perf_counter() - started) * 1000, 2)
        self.trajectory.write("model_call", step=step, latency_ms=latency_ms, response=payload)
        _progress("model_call", step=step, latency_ms=latency_ms)
        self.messages.append(_history_message(message))
        calls = message.get("tool_calls") or []
        if not calls:
            return Outcome("stopped", step, submission=message.get("content"))
        for call in calls:
            submission = self.call_tool(step, call)
            if submission is not None:
                return Outcome("submitted", step, submission=submission)
        return None

    def call_tool(self, step: int, call: dict[str, Any]) -> str | None:
        """Run one tool call and append its result; the summary when it was ``submit``."""
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
            summary = str(arguments.get("summary", ""))
            self._reply(step, call, name, {"status": "submitted"})
            return summary
        if name != "shell" or not isinstance(arguments.get("command"), str):
            self._reply(step, call, name, {"error": f"unknown tool or missing 'command': {name!r}"})
            return None
        timeout = max(1.0, min(self.config.command_timeout_s, self.deadline - time.monotonic()))
        started = time.perf_counter()
        code, output = run_shell(arguments["command"], timeout, self.config.max_output_chars)
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        self._reply(step, call, name, {"exit_code": code, "output": output}, duration_ms=duration_ms)
        return None

    def _reply(self, step: int, call: dict[str, Any], name: Any, result: dict[str, Any], **extra: Any) -> None:
        content = json.dumps(result, ensure_ascii=False)
        self.messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        self.trajectory.write(
            "tool_result",
            step=step,
            tool_call_id=call.get("id"),
            name=name,
            arguments=(call.get("function") or {}).get("arguments"),
            result=result,
            **extra,
        )


def _history_message(message: dict[str, Any]) -> dict[str, Any]:
    """The assistant message as it goes back into the history: role, content, tool calls, nothing else."""
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def _progress(event: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": event, "component": "builtin_agent", **fields}) + "\n")
    sys.stderr.flush()


# ---------------------------------------------------------------------------------------------------- entry
def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    """The run's settings from the command line (and the API key from the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m orchard.harnesses.builtin_agent", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:9000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--task-file", required=True, type=Path, help="File holding the task text.")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1800.0, help="Wall-clock limit of the run, seconds.")
    parser.add_argument("--command-timeout", type=float, default=120.0, help="Limit of one shell command, seconds.")
    parser.add_argument("--max-output-chars", type=int, default=10_000)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--trajectory", type=Path, default=Path("trajectory.jsonl"))
    parser.add_argument("--extra-body", default="{}", help="JSON object merged into every request body.")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="Environment variable holding the key.")
    args = parser.parse_args(argv)
    if args.max_steps < 1 or args.retries < 0:
        parser.error("--max-steps must be >= 1 and --retries >= 0")
    return AgentConfig(
        base_url=args.base_url,
        model=args.model,
        task=args.task_file.read_text(encoding="utf-8"),
        api_key=os.environ.get(args.api_key_env, ""),
        max_steps=args.max_steps,
        timeout_s=args.timeout,
        command_timeout_s=args.command_timeout,
        max_output_chars=args.max_output_chars,
        request_timeout_s=args.request_timeout,
        retries=args.retries,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        trajectory=args.trajectory,
        extra_body=json.loads(args.extra_body),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one episode; the exit code says whether the agent crashed (see the module docstring)."""
    try:
        config = parse_args(argv)
    except (OSError, ValueError) as exc:
        _progress("bad_arguments", error=str(exc))
        return EXIT_USAGE
    trajectory = Trajectory(config.trajectory)
    client = ChatClient(config)
    try:
        outcome = Agent(config, client, trajectory).run()
        trajectory.write(
            "end", status=outcome.status, steps=outcome.steps, submission=outcome.submission, error=outcome.error
        )
    finally:
        client.close()
        trajectory.close()
    _progress("end", status=outcome.status, steps=outcome.steps, error=outcome.error)
    return EXIT_ERROR if outcome.status == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
