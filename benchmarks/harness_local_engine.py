"""One Claude Code and one opencode episode against the local engine serving ``tiny-llama-32k``, recorded and graded.

The scripted backend answers a harness from a plan; here a model answers: Orchard's local engine
(``orchard engine serve --model tiny-llama-32k``, random weights, on the CPU) behind the recording proxy
(``orchard proxy serve``) and the Env (``orchard env serve``, local sandboxes), each in its own process on an
embedded bus, the episodes submitted to the Env's REST API as ``orchard rollout run`` does. A real harness's first
prompt is long in the tiny tokenizer's ~660 tokens: opencode's ~15,900 tokens, Claude Code's ~43,100 (its 21 tool
schemas are ~34,100), ~31,500 with ``CLAUDE_CODE_TRIM`` (Claude Code's own switches, passed as the adapter's
``extra_env``; ``--full-claude-code-prompt`` leaves them off, and the engine refuses the call: HTTP 400, the proxy's
``calls_refused``). ``tiny-llama-8k`` refuses both.

The weights are random, so the task ("write fixed into answer.txt") is not done: the episode ends ``FAILED`` with
reward 0. What is measured is the plumbing with a real model on the far side of a real harness:

- every call the harness made is answered (no 400 for the context length) and recorded: the proxy's
  ``calls_received`` and ``calls_recorded`` of the episode;
- token-exactly: each record's prompt (rebuilt from its prefix delta) is what the engine renders from the record's
  messages and tools (``POST /v1/tokenize``), and its completion's logprobs are what the engine's weights give those
  tokens in one forward pass over prompt + completion (``POST /v1/completions`` with ``echo``, ``max_tokens: 0``);
- the episode is graded and its outcome is on the bus.

Printed per harness: the API it spoke (the records' ``harness_api``), calls received / recorded, the proxy's
conversations, prompt tokens of the first call, mean seconds per call (the proxy's latency: the engine's prefill of
the whole prompt, then the completion), the largest logprob difference, seconds from submission to outcome, the
outcome's status and reward. The harnesses' completions are capped (Claude Code's ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``,
opencode's model ``limit``) so random-weight generation stays short. Claude Code answers a reply cut at that cap
with "Output token limit hit. Resume directly" up to three times, so its episode is four calls of ~31.5k tokens
(2-4 minutes on 2 cores: the engine has no prefix cache). Each call opens a new conversation in the proxy: Claude
Code sends the reply's text back verbatim, but random tokens are not the tokenizer's own split of their text (nor
always whole UTF-8), so the next prompt re-renders it as other tokens and diverges within the reply's first ones.

    python benchmarks/harness_local_engine.py [--harness claude-code opencode] [--max-tokens 32]
        [--model tiny-llama-32k] [--full-claude-code-prompt] [--work-dir DIR] [--json FILE]

``tests/integration/test_harness_local_engine.py`` runs the opencode episode and asserts on what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

import httpx

from orchard.bus import open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.episode_requests import EpisodeRequest
from orchard.prefix_delta import PromptReconstructor
from orchard.tokens import unpack_logprobs, unpack_token_ids
from orchard.topics import MODEL_CALLS, OUTCOMES, STANDARD_TOPICS
from producers.rollout.scheduler import EnvSubmitter

# Its sibling modules; the folder leaves sys.path again, because a test that loads this file by path must not
# find benchmarks/datasets.py where Hugging Face `datasets` is.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_servers import free_port, stop_in_order, wait_healthy  # noqa: E402
from recipe_runs import embedded_component_env  # noqa: E402

sys.path.remove(str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]
RUN_ID = "bench-harness-local-engine"
SERVED_MODEL = "policy"
TASK_ID = "write-answer"
TASK_YAML = f"""\
task_id: {TASK_ID}
instruction: Write the word fixed into a new file answer.txt, then stop.
grade_command: sh "$ORCHARD_GRADER_DIR/check.sh"
harness_timeout_s: 300
max_steps: 3
"""
CHECK = 'test "$(cat answer.txt)" = fixed && echo \'{"answer_written": 1.0}\' > "$ORCHARD_GRADER_OUT/signals.json"\n'
HARNESSES = ("claude-code", "opencode")
CLAUDE_CODE_TRIM = {
    "CLAUDE_CODE_DISABLE_CRON": "1",
    "CLAUDE_CODE_DISABLE_WORKFLOWS": "1",
    "CLAUDE_CODE_DISABLE_BUNDLED_SKILLS": "1",
    "CLAUDE_CODE_DISABLE_WEB_FETCH": "1",
    "CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1",
}
"""Claude Code's own switches that shorten its first prompt from ~43,100 tokens of the tiny tokenizer (21 tools,
~34,100 tokens of them) to ~31,500 (16 tools; no cron, workflow or web-fetch tools, no bundled skills listed, no
background tasks): what fits ``tiny-llama-32k``'s 32,768 with room for the completion."""
COLUMNS = (
    "harness", "api", "received", "recorded", "conversations", "first prompt", "s/call", "logprob diff", "episode s",
    "status", "reward",
)  # fmt: skip


@dataclass
class Stack:
    """The servers of one run and what they need."""

    work: Path
    env_url: str = ""
    proxy_url: str = ""
    engine_url: str = ""
    env_token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)


@dataclass(frozen=True)
class EpisodeResult:
    """What one harness's episode did, as printed."""

    harness: str
    harness_api: list[str]
    calls_received: int
    calls_recorded: int
    conversations: int
    records: int
    first_prompt_tokens: int
    completion_tokens: list[int]
    call_seconds: list[float]
    """The proxy's latency of each call (the engine's prefill and generation, mostly)."""
    prompts_as_rendered: bool
    """Every record's prompt is the engine's rendering of the record's messages and tools."""
    max_logprob_diff: float
    """Largest difference between a recorded completion logprob and the engine's forward pass over the sequence."""
    seconds: float
    status: str
    reward: float
    num_model_calls: int
    harness_exit_code: int | None
    error: str | None

    def row(self) -> list[str]:
        """The printed row (``COLUMNS``)."""
        return [
            self.harness, ",".join(self.harness_api), str(self.calls_received), str(self.calls_recorded),
            str(self.conversations), str(self.first_prompt_tokens), f"{mean(self.call_seconds):.1f}",
            f"{self.max_logprob_diff:.1e}", f"{self.seconds:.1f}", self.status, f"{self.reward:g}",
        ]  # fmt: skip


# ---------------------------------------------------------------------------------------------------- set-up
def write_task(tasks: Path) -> Path:
    """One task: a workspace with a README; the grader's check in hidden/."""
    task = tasks / TASK_ID
    (task / "workspace").mkdir(parents=True, exist_ok=True)
    (task / "workspace" / "README.md").write_text("Write the answer.\n")
    (task / "hidden").mkdir(exist_ok=True)
    (task / "hidden" / "check.sh").write_text(CHECK)
    (task / "task.yaml").write_text(TASK_YAML)
    return tasks


def component_env(stack: Stack) -> dict[str, str]:
    """What ``orchard run`` gives its components (``recipe_runs.embedded_component_env``)."""
    return embedded_component_env(stack.work, RUN_ID, stack.admin_token, stack.env_token)


def commands(stack: Stack, model: str, max_tokens: int, ports: dict[str, int]) -> dict[str, list[str]]:
    """The engine, the proxy and the Env, as ``orchard`` commands."""
    orchard = str(Path(sys.executable).with_name("orchard"))
    return {
        "engine": [orchard, "engine", "serve", "--model", model, "--served-model-name", SERVED_MODEL,
                   "--port", str(ports["engine"]), "--default-max-tokens", str(max_tokens)],
        "proxy": [orchard, "proxy", "serve", "--backend", f"http://127.0.0.1:{ports['engine']}/v1",
                  "--port", str(ports["proxy"])],
        "env": [orchard, "env", "serve", "--tasks", str(write_task(stack.work / "tasks")),
                "--proxy", f"http://127.0.0.1:{ports['proxy']}", "--port", str(ports["env"]), "--concurrency", "1",
                "--timeout", "600", "--sandboxes", str(stack.work / "sandboxes")],
    }  # fmt: skip


def start(stack: Stack, model: str, max_tokens: int) -> None:
    """The engine (its tiny checkpoint cached in the work directory), the proxy and the Env; returns once all three
    answer. The Env runs in the repository, where ``.orchard/harnesses`` holds the harness installations."""
    bus = open_bus(EmbeddedBusConfig(path=stack.work / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    bus.close()
    ports = {name: free_port() for name in ("engine", "proxy", "env")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    cwd = {"engine": stack.work, "proxy": REPO, "env": REPO}
    for name, command in commands(stack, model, max_tokens, ports).items():
        log = (stack.work / f"{name}.log").open("wb")
        process = subprocess.Popen(command, cwd=cwd[name], env=component_env(stack), stdout=log, stderr=log)
        stack.processes[name] = process
        wait_healthy(urls[name] + "/healthz", process, timeout_s=180, interval_s=0.2, log=stack.work / f"{name}.log")
    stack.engine_url, stack.proxy_url, stack.env_url = urls["engine"], urls["proxy"], urls["env"]


def stop(stack: Stack) -> None:
    """Stop the servers (the Env first, so it deletes its sandboxes)."""
    stop_in_order(stack.processes, ("env", "proxy", "engine"))


@contextmanager
def running(work: Path, model: str = "tiny-llama-32k", max_tokens: int = 32) -> Iterator[Stack]:
    """The three servers, started in ``work`` and stopped on the way out."""
    stack = Stack(work)
    try:
        start(stack, model, max_tokens)
        yield stack
    finally:
        stop(stack)


# ---------------------------------------------------------------------------------------------------- an episode
def harness_options(harness: str, max_tokens: int, trim: bool = True) -> dict[str, Any]:
    """The adapter's options: completions capped at ``max_tokens``, no retries of a failed call, and (``trim``)
    Claude Code's prompt shortened by ``CLAUDE_CODE_TRIM``."""
    if harness == "claude-code":
        return {"max_output_tokens": max_tokens, "max_retries": 0, "extra_env": CLAUDE_CODE_TRIM if trim else {}}
    if harness == "opencode":
        return {"context_tokens": 32768, "output_tokens": max_tokens}
    return {}


def run_episode(
    stack: Stack, harness: str, max_tokens: int = 32, *, trim: bool = True, timeout_s: float = 600
) -> EpisodeResult:
    """Submit one episode of ``harness`` to the Env, wait for its outcome, check its records against the engine."""
    episode_id = f"local-engine-{harness}-{secrets.token_hex(3)}"
    request = EpisodeRequest(
        task_id=TASK_ID, group_id=TASK_ID, episode_id=episode_id, harness=harness, model=SERVED_MODEL,
        options={"harness": harness_options(harness, max_tokens, trim)},
    )  # fmt: skip
    started = time.perf_counter()
    submit = EnvSubmitter(stack.env_url, stack.env_token)
    try:
        submit(request)
    finally:
        submit.close()
    outcome = wait_outcome(stack.work / "bus", episode_id, timeout_s)
    return episode_result(stack, harness, outcome, time.perf_counter() - started)


def episode_result(stack: Stack, harness: str, outcome: dict[str, Any], seconds: float) -> EpisodeResult:
    """What the episode did: the proxy's summary, the records checked against the engine, the Env's result."""
    episode_id = outcome["episode_id"]
    records = episode_records(stack.work / "bus", episode_id)
    summary = admin_get(stack.proxy_url, stack.admin_token, f"/admin/episodes/{episode_id}")
    episode = env_get(stack, f"/episodes/{episode_id}")
    prompts, rendered, diff = check_against_engine(stack.engine_url, records)
    return EpisodeResult(
        harness=harness,
        harness_api=sorted({r["harness_api"] for r in records}),
        calls_received=int(summary.get("calls_received", 0)),
        calls_recorded=int(summary.get("calls_recorded", 0)),
        conversations=int(summary.get("conversations", 0)),
        records=len(records),
        first_prompt_tokens=len(prompts[0]) if prompts else 0,
        completion_tokens=[len(unpack_token_ids(r["completion_token_ids"])) for r in records],
        call_seconds=[r["latency_ms"] / 1000 for r in records],
        prompts_as_rendered=rendered,
        max_logprob_diff=diff,
        seconds=seconds,
        status=outcome["status"],
        reward=float(outcome["reward"]),
        num_model_calls=int(outcome["num_model_calls"]),
        harness_exit_code=(episode.get("result") or {}).get("harness_exit_code"),
        error=outcome.get("error"),
    )


def wait_outcome(bus_path: Path, episode_id: str, timeout_s: float) -> dict[str, Any]:
    """The episode's outcome, read from the bus as it arrives."""
    bus = open_bus(EmbeddedBusConfig(path=bus_path))
    consumer = bus.consumer([OUTCOMES], group=None, start="earliest")
    codec, deadline = Codec.default(), time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_s=0.5):
                outcome = codec.decode(record.value).record
                if outcome["episode_id"] == episode_id:
                    return dict(outcome)
    finally:
        consumer.close()
        bus.close()
    raise TimeoutError(f"no outcome for {episode_id} in {timeout_s:g} s")


def episode_records(bus_path: Path, episode_id: str) -> list[dict[str, Any]]:
    """The episode's ModelCall records, in call order."""
    bus = open_bus(EmbeddedBusConfig(path=bus_path))
    consumer = bus.consumer([MODEL_CALLS], group=None, start="earliest")
    codec = Codec.default()
    records = [
        codec.decode(r.value).record
        for r in read_until_quiet(consumer, max_records=500, poll_timeout_s=0.5, idle_polls=1)
    ]
    consumer.close()
    bus.close()
    return sorted((r for r in records if r["episode_id"] == episode_id), key=lambda r: r["call_index"])


def admin_get(proxy_url: str, token: str, path: str) -> dict[str, Any]:
    """A proxy admin route's JSON (the episode's summary, kept after it closed)."""
    return dict(httpx.get(proxy_url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30).json())


def env_get(stack: Stack, path: str) -> dict[str, Any]:
    """An Env route's JSON (the episode, with its result)."""
    headers = {"Authorization": f"Bearer {stack.env_token}"}
    return dict(httpx.get(stack.env_url + path, headers=headers, timeout=30).json())


# ---------------------------------------------------------------------------------------------------- token-exact
def check_against_engine(engine_url: str, records: Sequence[dict[str, Any]]) -> tuple[list[list[int]], bool, float]:
    """Each record's prompt (rebuilt), whether every prompt is the engine's rendering of the record's messages and
    tools, and the largest difference between a recorded logprob and the engine's forward pass."""
    rebuilt, prompts, rendered, diff = PromptReconstructor(), [], True, 0.0
    with httpx.Client(base_url=engine_url, timeout=600) as client:
        for record in records:
            prompt = rebuilt.add_model_call(record).tolist()
            prompts.append(prompt)
            body = {"model": SERVED_MODEL, "messages": rebuilt.messages(record["call_index"]),
                    "tools": json.loads(record["request_tools_json"]) or None}  # fmt: skip
            rendered &= client.post("/v1/tokenize", json=body).json()["tokens"] == prompt
            diff = max(diff, logprob_difference(client, prompt, record))
    return prompts, rendered, diff


def logprob_difference(client: httpx.Client, prompt: list[int], record: dict[str, Any]) -> float:
    """Largest |recorded - scored| logprob of the record's completion, scored by the engine over prompt + completion."""
    completion = unpack_token_ids(record["completion_token_ids"]).tolist()
    recorded = unpack_logprobs(record["completion_logprobs"]).tolist()
    if not completion:
        return 0.0
    body = {"model": SERVED_MODEL, "prompt": prompt + completion, "echo": True, "logprobs": 0, "max_tokens": 0}
    scored = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["token_logprobs"]
    return max(abs(a - b) for a, b in zip(recorded, scored[len(prompt) :], strict=True))


# ---------------------------------------------------------------------------------------------------- main
def mean(values: Sequence[float]) -> float:
    """The mean, 0 of nothing."""
    return fmean(values) if values else 0.0


def table(results: Sequence[EpisodeResult]) -> str:
    """The results as an aligned text table."""
    rows = [list(COLUMNS), *(result.row() for result in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)


def report(results: Sequence[EpisodeResult], model: str, max_tokens: int) -> None:
    """Print the table and, per harness, what does not fit in it."""
    print(f"{model} on the local engine (CPU, {os.cpu_count()} cores), completions capped at {max_tokens}")
    print(table(results))
    for result in results:
        print(
            f"{result.harness}: completion tokens per call {result.completion_tokens}, prompts as rendered: "
            f"{result.prompts_as_rendered}, harness exit code {result.harness_exit_code}, error {result.error}"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", nargs="+", default=list(HARNESSES), choices=HARNESSES)
    parser.add_argument("--model", default="tiny-llama-32k")
    parser.add_argument("--max-tokens", type=int, default=32, help="Completion cap of every harness call.")
    parser.add_argument(
        "--full-claude-code-prompt", action="store_true", help="Claude Code without CLAUDE_CODE_TRIM (~43k tokens)."
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="Keep the logs, bus and sandboxes here.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the results as JSON.")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="orchard-harness-engine-"))
    work.mkdir(parents=True, exist_ok=True)
    with running(work.resolve(), args.model, args.max_tokens) as stack:
        trim = not args.full_claude_code_prompt
        results = [run_episode(stack, harness, args.max_tokens, trim=trim) for harness in args.harness]
    report(results, args.model, args.max_tokens)
    print(f"logs, bus and sandboxes in {work}")
    if args.json:
        args.json.write_text(json.dumps([asdict(result) for result in results], indent=2) + "\n")


if __name__ == "__main__":
    main()
