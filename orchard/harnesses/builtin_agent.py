"""Orchard's built-in minimal tool-calling agent: a standalone program for tests and the CPU recipe.

Run inside a sandbox as::

    OPENAI_API_KEY=<proxy token> python -I -S -m orchard.harnesses.builtin_agent \
        --base-url http://127.0.0.1:9000/v1 --model policy --task-file task.md --max-steps 30

It needs only the standard library (it runs with whatever interpreter the sandbox has, with ``-S`` too), and imports
little of it, because its start-up is paid by every episode: no structlog, pydantic or httpx, no ``typing``,
``dataclasses`` or ``pathlib`` at run time. Progress goes to stderr as JSON lines, and the trajectory to a JSONL file.

The loop: a system prompt and the task, then up to ``--max-steps`` chat completions (not streamed) with two tools,
``shell`` (run a command in the working directory with ``/bin/sh -c``; the reply is the exit code and the output,
stdout and stderr merged, truncated in the middle to ``--max-output-chars``) and ``submit`` (end the episode). The
assistant message is appended to the history exactly as returned, then one ``tool`` message per call, in order.
The loop takes what it runs as parameters (``Agent``'s tool executor, system prompt and ``start`` fields, ``main``'s
agent builder), so the recipes' agents (``recipes.claw.agent``, ``recipes.gui.agent``) run it instead of a copy.

Model calls are plain HTTP/1.1 over a socket, one connection per call (``Connection: close``; ``http.client`` for an
``https`` base URL), so no call ever meets a kept-alive connection the server dropped while a tool ran. The base URL
is the endpoint itself: ``HTTP_PROXY``-style variables are not honoured.

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
import socket
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing would cost every episode's start-up
    from collections.abc import Callable, Sequence
    from typing import Any, Protocol, TextIO

    class JsonResponse(Protocol):
        """What ``_completion`` reads: this module's ``HttpResponse``, or an httpx response."""

        text: str

        def json(self) -> Any: ...

    class ToolExecutor(Protocol):
        """What ``Agent`` runs tool calls with (``ShellTool``, or a recipe's own executor)."""

        tools: list[dict[str, Any]]

        def refusal(self, name: Any, arguments: dict[str, Any]) -> str | None: ...

        def run(self, name: str, arguments: dict[str, Any], timeout_s: float) -> Any: ...

    class Closable(Protocol):
        """Something a run holds until it ends (a client, a service process)."""

        def close(self) -> None: ...

    OpenAgent = Callable[["AgentConfig", "Trajectory", "list[Closable]"], "Agent"]
    """Builds the agent ``main`` runs (see ``main``)."""


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
MAX_HEADER_LINE = 65_536
USER_AGENT = "orchard-builtin-agent"


class ModelError(RuntimeError):
    """The model API failed for good (after retries, or with a non-retryable answer)."""


class TransportError(OSError):
    """The model API could not be reached, or its answer was not HTTP (retried like a refused connection)."""


class AgentConfig:
    """Command-line settings of one run."""

    def __init__(
        self,
        base_url: str,
        model: str,
        task: str,
        api_key: str,
        max_steps: int = 30,
        timeout_s: float = 1800.0,
        command_timeout_s: float = 120.0,
        max_output_chars: int = 10_000,
        request_timeout_s: float = 600.0,
        retries: int = 3,
        temperature: float | None = None,
        max_tokens: int | None = None,
        trajectory: str | os.PathLike[str] = "trajectory.jsonl",
        extra_body: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.base_url, self.model, self.task, self.api_key = base_url, model, task, api_key
        self.max_steps, self.timeout_s, self.command_timeout_s = max_steps, timeout_s, command_timeout_s
        self.max_output_chars, self.request_timeout_s, self.retries = max_output_chars, request_timeout_s, retries
        self.temperature, self.max_tokens = temperature, max_tokens
        self.trajectory = trajectory
        self.extra_body: dict[str, Any] = {} if extra_body is None else extra_body
        self.seed = seed


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


# ---------------------------------------------------------------------------------------------------- http
class HttpResponse:
    """A whole HTTP response: its status and body."""

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code, self.content = status_code, content

    @property
    def text(self) -> str:
        """The body as text (UTF-8, undecodable bytes replaced)."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` if it is not)."""
        return json.loads(self.content)


def split_url(url: str) -> tuple[str, str, str, int, str]:
    """``(scheme, authority, host, port, path)`` of an absolute URL (``urllib.parse`` would cost every start-up ~2 ms).

    >>> split_url("http://127.0.0.1:9000/v1/")
    ('http', '127.0.0.1:9000', '127.0.0.1', 9000, '/v1/')
    >>> split_url("HTTPS://user@[::1]"), split_url("http://h")
    (('https', '[::1]', '::1', 443, '/'), ('http', 'h', 'h', 80, '/'))
    """
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    authority = netloc.rpartition("@")[2]
    if authority.startswith("["):
        host, _, port = authority[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = authority.partition(":")
    default = 443 if scheme.lower() == "https" else 80
    return scheme.lower(), authority, host, int(port) if port.isdigit() else default, slash + path or "/"


class HttpEndpoint:
    """POSTs JSON to paths under a base URL, one connection per request; transport failures raise ``OSError``."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/") + "/"
        self.scheme, authority, self.host, self.port, self.prefix = split_url(self.base_url)
        self.timeout_s = timeout_s
        self.headers = {
            "Host": authority,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
            "Connection": "close",
        }
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def post(self, path: str, body: Any) -> HttpResponse:
        """POST ``body`` as JSON to ``path`` (relative to the base URL) and read the whole answer."""
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        target = self.prefix + path
        if self.scheme not in ("http", "https") or not self.host:
            raise TransportError(f"not an http(s) base URL: {self.base_url!r}")
        if self.scheme == "https":
            return self._post_tls(target, data)
        head = [f"POST {target} HTTP/1.1", *(f"{k}: {v}" for k, v in self.headers.items())]
        head.append(f"Content-Length: {len(data)}")
        with socket.create_connection((_ascii_host(self.host), self.port), timeout=self.timeout_s) as sock:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
            with sock.makefile("rb") as reader:
                return read_response(reader)

    def _post_tls(self, target: str, data: bytes) -> HttpResponse:
        import http.client
        import ssl

        connection = http.client.HTTPSConnection(
            self.host, self.port, timeout=self.timeout_s, context=ssl.create_default_context()
        )
        try:
            connection.request("POST", target, body=data, headers=self.headers)
            response = connection.getresponse()
            return HttpResponse(response.status, response.read())
        except http.client.HTTPException as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            connection.close()


def _ascii_host(host: str) -> str | bytes:
    """An ASCII host as bytes, which ``getaddrinfo`` takes as is (a ``str`` is IDNA-encoded: ~1 ms of imports)."""
    return host.encode() if host.isascii() else host


def read_response(reader: Any) -> HttpResponse:
    """One HTTP/1.x response from a binary file (interim 1xx answers skipped): a body framed by ``Content-Length``,
    chunked, or running to the end of the connection."""
    while True:
        status, headers = _read_head(reader)
        if not 100 <= status < 200:
            break
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return HttpResponse(status, _read_chunked(reader))
    if "content-length" not in headers:
        return HttpResponse(status, reader.read())
    length = _number(headers["content-length"], 10)
    return HttpResponse(status, _read_exactly(reader, length))


def _read_head(reader: Any) -> tuple[int, dict[str, str]]:
    """The status code and the headers (lower-case names) of one response."""
    line = reader.readline(MAX_HEADER_LINE)
    version, _, rest = line.partition(b" ")
    if not version.startswith(b"HTTP/"):
        raise TransportError(f"not an HTTP response: {line[:200]!r}")
    status = _number(rest[:3].decode("latin-1"), 10)
    headers: dict[str, str] = {}
    while (line := reader.readline(MAX_HEADER_LINE)).strip():
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if not line:
        raise TransportError("the connection closed inside the response headers")
    return status, headers


def _read_chunked(reader: Any) -> bytes:
    """A chunked body, trailers dropped."""
    chunks = []
    while size := _number(reader.readline(MAX_HEADER_LINE).split(b";", 1)[0].strip().decode("latin-1"), 16):
        chunks.append(_read_exactly(reader, size))
        reader.readline(MAX_HEADER_LINE)
    while reader.readline(MAX_HEADER_LINE).strip():
        pass
    return b"".join(chunks)


def _read_exactly(reader: Any, size: int) -> bytes:
    data = reader.read(size)
    if len(data) < size:
        raise TransportError(f"the connection closed {size - len(data)} bytes before the end of the body")
    return bytes(data)


def _number(text: str, base: int) -> int:
    try:
        return int(text, base)
    except ValueError:
        raise TransportError(f"malformed HTTP response: {text[:100]!r} is not a number") from None


# ---------------------------------------------------------------------------------------------------- model
def call_seed(seed: int, call: int) -> int:
    """The seed of an episode's ``call``-th completion (0-based): the episode's ``seed`` plus ``call``, kept to the
    non-negative 63 bits servers accept, so calls do not share one random stream (the engine mixes its seed before
    use, so neighbouring seeds give unrelated streams).

    >>> call_seed(7, 2), call_seed(2**63 - 1, 1)
    (9, 0)
    """
    return (seed + call) & 0x7FFFFFFFFFFFFFFF


class ChatClient:
    """Chat completions offering ``tools`` (default: the built-in ``shell`` and ``submit``), with retries of transport
    errors, 429 and 5xx."""

    def __init__(self, config: AgentConfig, tools: list[dict[str, Any]] | None = None) -> None:
        self.config = config
        self.tools: list[dict[str, Any]] = TOOLS if tools is None else tools
        self.endpoint = HttpEndpoint(config.base_url, config.api_key, config.request_timeout_s)
        self.calls = 0  # completions asked for so far: the index of a seeded call's own seed

    def complete(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """One non-streamed completion with the client's tools (``extra_body`` is merged over the request)."""
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "tools": self.tools,
            "tool_choice": "auto",
            **self.config.extra_body,
        }
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        if self.config.seed is not None:  # each call its own stream; a retry asks with the same one
            body["seed"] = call_seed(self.config.seed, self.calls)
        self.calls += 1
        for attempt in range(self.config.retries + 1):
            last_try = attempt == self.config.retries
            try:
                response = self.endpoint.post("chat/completions", body)
            except OSError as exc:
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
        """Nothing to release: every call has its own connection."""


def _completion(response: JsonResponse) -> dict[str, Any]:
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

    def __init__(self, path: str | os.PathLike[str]) -> None:
        directory = os.path.dirname(os.fspath(path))
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.file: TextIO = open(path, "w", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        """Append one record ``{"event": ..., "time": ..., **fields}``."""
        self.file.write(json.dumps({"event": event, "time": time.time(), **fields}, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        """Close the file."""
        self.file.close()


class Outcome:
    """How the loop ended."""

    def __init__(self, status: str, steps: int, submission: str | None = None, error: str | None = None) -> None:
        self.status, self.steps, self.submission, self.error = status, steps, submission, error

    def __repr__(self) -> str:
        return f"Outcome({self.status!r}, {self.steps}, submission={self.submission!r}, error={self.error!r})"


class ShellTool:
    """The built-in agent's tool executor: ``shell`` runs a command with ``/bin/sh -c`` (``run_shell``).

    An executor is what ``Agent`` runs tool calls with (the Claw agent passes its services'): ``tools``, the tool
    definitions the model is offered (``submit`` included, which ``Agent`` handles itself); ``refusal(name,
    arguments)``, why a call cannot run (None when it can); ``run(name, arguments, timeout_s)``, the call's result
    object."""

    tools: list[dict[str, Any]] = TOOLS

    def __init__(self, max_output_chars: int) -> None:
        self.max_output_chars = max_output_chars

    def refusal(self, name: Any, arguments: dict[str, Any]) -> str | None:
        """An error for any call but ``shell`` with a string ``command``."""
        if name != "shell" or not isinstance(arguments.get("command"), str):
            return f"unknown tool or missing 'command': {name!r}"
        return None

    def run(self, name: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Run the command: its exit code (None when killed at ``timeout_s``) and its output."""
        code, output = run_shell(arguments["command"], timeout_s, self.max_output_chars)
        return {"exit_code": code, "output": output}


class Agent:
    """The multi-turn loop: ask the model, run its tool calls, repeat until submit, a text answer, or a limit.

    What it runs is a parameter: ``executor`` runs the tool calls (default: ``ShellTool``), ``system_prompt`` opens
    the history, and ``start_fields`` are added to the trajectory's ``start`` record."""

    def __init__(
        self,
        config: AgentConfig,
        client: ChatClient,
        trajectory: Trajectory,
        executor: ToolExecutor | None = None,
        system_prompt: str = SYSTEM_PROMPT,
        start_fields: dict[str, Any] | None = None,
    ) -> None:
        self.config, self.client, self.trajectory = config, client, trajectory
        self.executor: ToolExecutor = ShellTool(config.max_output_chars) if executor is None else executor
        self.start_fields: dict[str, Any] = {} if start_fields is None else start_fields
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt},
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
            tools=[tool["function"]["name"] for tool in self.executor.tools],
            **self.start_fields,
        )
        return self.loop()

    def loop(self) -> Outcome:
        """Steps until one ends the episode, the model API fails, or the step or time budget runs out."""
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
        self.progress("model_call", step=step, latency_ms=latency_ms)
        self.messages.append(_history_message(message))
        calls = message.get("tool_calls") or []
        if not calls:
            return Outcome("stopped", step, submission=message.get("content"))
        for call in calls:
            submission = self.call_tool(step, call)
            if submission is not None:
                return Outcome("submitted", step, submission=submission)
        self.after_tool_calls(step)
        return None

    def after_tool_calls(self, step: int) -> None:
        """Called once a step's tool calls have all run and none ended the episode (here: nothing to do)."""

    def progress(self, event: str, **fields: Any) -> None:
        """A progress line on stderr."""
        _progress(event, **fields)

    def call_tool(self, step: int, call: dict[str, Any]) -> str | None:
        """Run one tool call with the executor and append its result; the summary when it was ``submit``."""
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
        refusal = self.executor.refusal(name, arguments)
        if refusal is not None:
            self._reply(step, call, name, {"error": refusal})
            return None
        timeout = max(1.0, min(self.config.command_timeout_s, self.deadline - time.monotonic()))
        started = time.perf_counter()
        result = self.executor.run(name, arguments, timeout)
        duration_ms = round((time.perf_counter() - started) * 1000, 2)
        self._reply(step, call, name, result, duration_ms=duration_ms)
        return None

    def _reply(self, step: int, call: dict[str, Any], name: Any, result: Any, **extra: Any) -> None:
        """Append the call's result to the history (a text as it is, anything else as JSON) and the trajectory."""
        content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
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
class _Help(argparse.HelpFormatter):
    """argparse's help at a fixed width: asking the terminal's would import ``shutil`` (and bz2, lzma) at every start,
    since each ``add_argument`` builds a formatter."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=100)


def parse_args(argv: Sequence[str] | None = None) -> AgentConfig:
    """The run's settings from the command line (and the API key from the environment)."""
    parser = argparse.ArgumentParser(
        prog="python -m orchard.harnesses.builtin_agent", description=__doc__.split("\n")[0], formatter_class=_Help
    )
    parser.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:9000/v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--task-file", required=True, help="File holding the task text.")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1800.0, help="Wall-clock limit of the run, seconds.")
    parser.add_argument("--command-timeout", type=float, default=120.0, help="Limit of one shell command, seconds.")
    parser.add_argument("--max-output-chars", type=int, default=10_000)
    parser.add_argument("--request-timeout", type=float, default=600.0)
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--trajectory", default="trajectory.jsonl")
    parser.add_argument("--extra-body", default="{}", help="JSON object merged into every request body.")
    parser.add_argument("--seed", type=int, help="Sampling seed of the episode: call i asks with its own seed from it.")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="Environment variable holding the key.")
    args = parser.parse_args(argv)
    if args.max_steps < 1 or args.retries < 0:
        parser.error("--max-steps must be >= 1 and --retries >= 0")
    return AgentConfig(
        base_url=args.base_url,
        model=args.model,
        task=_read_text(args.task_file),
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
        seed=args.seed,
    )


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def open_builtin_agent(config: AgentConfig, trajectory: Trajectory, closing: list[Closable]) -> Agent:
    """The built-in agent: ``Agent`` with the ``shell`` and ``submit`` tools."""
    client = ChatClient(config)
    closing.append(client)
    return Agent(config, client, trajectory)


def main(argv: Sequence[str] | None = None, open_agent: OpenAgent | None = None) -> int:
    """Run one episode; the exit code says whether the agent crashed (see the module docstring).

    ``open_agent(config, trajectory, closing)`` builds the agent (default: ``open_builtin_agent``), appending what
    must be closed once the run ends to ``closing``; an ``OSError`` or ``RuntimeError`` it raises (say, a service
    the agent needs did not start) ends the episode as ``error`` after 0 steps. The Claw agent runs through here."""
    try:
        config = parse_args(argv)
    except (OSError, ValueError) as exc:
        _progress("bad_arguments", error=str(exc))
        return EXIT_USAGE
    trajectory = Trajectory(config.trajectory)
    closing: list[Closable] = []
    try:
        try:
            agent = (open_agent or open_builtin_agent)(config, trajectory, closing)
        except (OSError, RuntimeError) as exc:
            outcome = Outcome("error", 0, error=str(exc))
        else:
            outcome = agent.run()
        trajectory.write(
            "end", status=outcome.status, steps=outcome.steps, submission=outcome.submission, error=outcome.error
        )
    finally:
        for resource in reversed(closing):  # the last opened first: the client before the services it calls
            resource.close()
        trajectory.close()
    _progress("end", status=outcome.status, steps=outcome.steps, error=outcome.error)
    return EXIT_ERROR if outcome.status == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
