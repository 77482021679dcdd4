"""``orchard eval --tasks``: a held-out evaluation through a real Orchard Env service (REST, scheduler, local
sandboxes, the built-in harness, the recording proxy, the recipe's grader) on the file-lookup eval split, the
scripted expert solving some tasks and failing others; the run's results table gets the stage's success rate and
Wilson interval, and ``orchard eval --plot`` draws the reward curve from the same bus. ``--attempts 2`` scores
pass@2 beside pass@1, broken down by the tasks' ``repo`` label, with the calls and tokens the episodes cost."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner, Result

from orchard.bus import Bus, open_bus
from orchard.cli.common import CliState
from orchard.cli.train_value import eval_rerank
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig
from orchard.engines.expert import ExpertBackend
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.scheduler import Scheduler
from orchard.env.service import create_env_app
from orchard.env.tasks import TaskCatalog
from orchard.evaluation.cost import CLOCK_MARGIN_MS, TokenCount, read_token_counts
from orchard.evaluation.heldout import eval_episode_id
from orchard.evaluation.stats import wilson_interval
from orchard.sandbox.local.runtime import LocalRuntime
from orchard.tokens import pack_logprobs, pack_token_ids
from orchard.topics import OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.file_lookup.expert import DemoKind, Expert
from recipes.file_lookup.generate import LookupConfig, LookupTask, generate

pytestmark = [pytest.mark.harness]
RUN_ID = "heldout-run"
MODEL = "file-lookup-expert"
ADMIN = "admin-secret-0123456789"  # noqa: S105 - test tokens
ENV_TOKEN = "env-secret-0123456789"  # noqa: S105
STAGE = "sft"
KINDS = [DemoKind.PERFECT, DemoKind.WRONG_KEY, DemoKind.PERFECT, DemoKind.NO_ANSWER]
"""What the expert does on eval tasks 0..3: two solved, two failed (rewards 1, 0, 1, 0)."""
PASS_STAGE = "pass2"  # noqa: S105 - a stage name
RETRY_KINDS = [DemoKind.WRONG_KEY, DemoKind.PERFECT, DemoKind.PERFECT, DemoKind.NO_ANSWER]
"""The second attempts of stage ``pass2`` (its first attempts are ``KINDS``): tasks 0..2 solved by one attempt or
both, task 3 by none: pass@2 3/4, pass@1 4/8."""
REPOS = ["alpha", "beta", "alpha", "beta"]
"""The ``repo`` label of eval tasks 0..3 (written into their task.yaml)."""


@pytest.fixture
def env_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The eval split, the expert (a plan per evaluation episode id), the proxy, and the Env service on an embedded
    bus; the run directory's orchard.yaml names that bus."""
    monkeypatch.setattr("orchard.cli.common.configure_logging", lambda *args, **kwargs: None)
    generate(LookupConfig(train_tasks=0, eval_tasks=len(KINDS)), tmp_path / "tasks")
    eval_dir = tmp_path / "tasks" / "eval"
    backend, expert = ExpertBackend(model=MODEL, policy_version=3), Expert()
    for directory, kind, retry, repo in zip(sorted(eval_dir.iterdir()), KINDS, RETRY_KINDS, REPOS, strict=True):
        spec = yaml.safe_load((directory / "task.yaml").read_text())
        (directory / "task.yaml").write_text(yaml.safe_dump(spec | {"labels": {"repo": repo, "split": "eval"}}))
        task = LookupTask.from_directory(directory)
        for stage, index, plan_kind in ((STAGE, 0, kind), (PASS_STAGE, 0, kind), (PASS_STAGE, 1, retry)):
            episode_id = eval_episode_id(RUN_ID, stage, task.task_id, index)
            backend.register(episode_id, expert.demonstrate(task, episode_id, plan_kind).plan)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = {"run_id": RUN_ID, "bus": {"type": "embedded", "path": str(tmp_path / "bus")},
              "store": {"type": "local", "path": str(tmp_path / "store")}}  # fmt: skip
    (run_dir / "orchard.yaml").write_text(yaml.safe_dump(config))
    bus = open_bus(EmbeddedBusConfig(path=tmp_path / "bus"))
    for spec in STANDARD_TOPICS:
        bus.create_topic(spec.name, spec.partitions, exist_ok=True)
    backend_server = BackgroundServer(backend, lifespan="off").start()
    settings = ProxySettings(backend_base_url=f"{backend_server.url}/v1", admin_token=ADMIN, run_id=RUN_ID)
    proxy = BackgroundServer(create_proxy_app(settings, bus)).start()
    runtime = LocalRuntime(tmp_path / "sandboxes")
    runner = LocalEpisodeRunner(
        runtime=runtime, tasks=TaskCatalog(eval_dir), proxy=ProxyAdmin(proxy.url, ADMIN), proxy_url=proxy.url,
        producer=bus.producer(), run_id=RUN_ID,
    )  # fmt: skip
    env = BackgroundServer(create_env_app(Scheduler(runner, concurrency=4, timeout_s=120), ENV_TOKEN)).start()
    yield {"env": env.url, "tasks": eval_dir, "run_dir": run_dir, "bus": bus}
    env.stop()
    runtime.close()
    proxy.stop()
    backend_server.stop()
    bus.close()


def outcomes(bus: Bus) -> list[dict[str, Any]]:
    """Every outcome on the bus, decoded."""
    codec, found = Codec.default(), []
    with bus.consumer([OUTCOMES]) as reader:
        while batch := reader.poll(timeout_s=0.2):
            found.extend(codec.decode(record.value).record for record in batch)
    return found


def orchard_eval(*args: str) -> Result:
    """``orchard eval ARGS`` in-process, without --config (the run directory's orchard.yaml is used)."""
    app = typer.Typer()

    @app.callback()
    def main(ctx: typer.Context) -> None:
        ctx.obj = CliState()

    app.command("eval")(eval_rerank)
    return CliRunner().invoke(app, ["eval", *args])


def test_heldout_evaluation_through_env_writes_the_stage_success_rate_and_wilson_interval(
    env_stack: dict[str, Any],
) -> None:
    run_dir: Path = env_stack["run_dir"]
    args = ["--tasks", str(env_stack["tasks"]), "--env", env_stack["env"], "--env-token", ENV_TOKEN,
            "--harness", "builtin", "--model", MODEL, "--stage", STAGE, "--run-dir", str(run_dir),
            "--timeout", "120"]  # fmt: skip

    result = orchard_eval(*args)

    assert result.exit_code == 0, (result.output, result.exception)
    assert "stage sft: success 50.0% (2/4)" in result.output
    stages = json.loads((run_dir / "results.json").read_text())["stages"]
    low, high = wilson_interval(2, 4)
    assert [(s["stage"], s["tasks"], s["successes"], s["success_rate"], s["missing"]) for s in stages] == [
        ("sft", 4, 2, 0.5, 0),
    ]  # fmt: skip
    assert (stages[0]["success_ci_low"], stages[0]["success_ci_high"]) == (low, high)
    assert stages[0]["mean_reward"] == 0.5
    assert 0 < stages[0]["wall_time_s"] < 120
    assert "| sft | first | 4 | 50.0% (2/4) | [15.0%, 85.0%] | - | - | 50.0% |" in (run_dir / "results.md").read_text()
    assert "by repo" in result.output  # every task has a repo label: the default breakdown
    detail = json.loads((run_dir / "eval" / "sft.json").read_text())
    assert [t["episodes"][0]["status"] for t in detail["tasks"]] == ["SUCCEEDED", "FAILED", "SUCCEEDED", "FAILED"]
    assert [t["episodes"][0]["reward"] for t in detail["tasks"]] == [1.0, 0.0, 1.0, 0.0]

    again = orchard_eval(*args)  # Env already has these episodes (409): their outcomes are read back, one row

    assert again.exit_code == 0, (again.output, again.exception)
    assert len(json.loads((run_dir / "results.json").read_text())["stages"]) == 1

    plotted = orchard_eval("--plot", "--run-dir", str(run_dir))  # only eval episodes so far: nothing to draw

    assert plotted.exit_code != 0
    assert "no outcomes to plot" in str(plotted.exception)
    training = [dict(outcome, episode_id=f"train-{i}", group_id=f"r000000-{outcome['task_id']}")
                for i, outcome in enumerate(outcomes(env_stack["bus"]))]  # fmt: skip
    codec = Codec.default()
    with env_stack["bus"].producer() as producer:
        for record in training:
            producer.send(OUTCOMES, codec.encode("EpisodeOutcome", record), key=record["episode_id"].encode())

    plotted = orchard_eval("--plot", "--run-dir", str(run_dir), "--window", "2")

    assert plotted.exit_code == 0, (plotted.output, plotted.exception)
    assert (run_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pass_at_2_through_env_reports_pass_at_1_beside_it_by_repo_with_calls_and_tokens(
    env_stack: dict[str, Any],
) -> None:
    run_dir: Path = env_stack["run_dir"]

    result = orchard_eval(
        "--tasks", str(env_stack["tasks"]), "--env", env_stack["env"], "--env-token", ENV_TOKEN, "--model", MODEL,
        "--stage", PASS_STAGE, "--run-dir", str(run_dir), "--timeout", "120", "--attempts", "2",
    )  # fmt: skip

    assert result.exit_code == 0, (result.output, result.exception)
    assert "stage pass2: success 75.0% (3/4)" in result.output
    assert "pass@2 75.0%, pass@1 50.0% (mean over attempts)" in result.output
    (row,) = json.loads((run_dir / "results.json").read_text())["stages"]
    assert (row["selection"], row["samples_per_task"], row["successes"], row["pass_at_1"]) == ("pass@2", 2, 3, 0.5)
    assert row["success_rate"] >= row["pass_at_1"]
    detail = json.loads((run_dir / "eval" / "pass2.json").read_text())
    assert [(t["labels"]["repo"], len(t["episodes"])) for t in detail["tasks"]] == [(repo, 2) for repo in REPOS]
    assert [(g["value"], g["successes"], g["tasks"], g["pass_at_1"]) for g in detail["breakdown"]["repo"]] == [
        ("alpha", 2, 2, 0.75), ("beta", 1, 2, 0.25),
    ]  # fmt: skip
    cost = detail["cost"]
    calls = sum(e["num_model_calls"] for t in detail["tasks"] for e in t["episodes"])
    assert calls > 0
    assert (cost["model_calls"], cost["calls_read"], cost["tokens_complete"]) == (calls, calls, True)
    assert cost["prompt_tokens"] > 0 and cost["completion_tokens"] > 0
    assert (row["model_calls"], row["prompt_tokens"], row["completion_tokens"]) == (
        calls, cost["prompt_tokens"], cost["completion_tokens"],
    )  # fmt: skip
    assert 0 < cost["episode_time_s"] and cost["timed_episodes"] == 8
    report = (run_dir / "eval" / "pass2.md").read_text()
    assert "| alpha | 2 | 100.0% (2/2) | [34.2%, 100.0%] | 75.0% |" in report
    assert f"| {calls} | {cost['prompt_tokens']:,} | {cost['completion_tokens']:,} |" in report


def test_heldout_evaluation_names_every_missing_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_ENV_TOKEN", raising=False)

    result = orchard_eval("--tasks", str(tmp_path), "--model", "m")

    assert result.exit_code != 0
    assert str(result.exception) == (
        "a held-out evaluation (--tasks) also needs --env, --env-token (or ORCHARD_ENV_TOKEN), --stage, --run-dir"
    )
    assert "--plot needs --run-dir" in str(orchard_eval("--plot").exception)
    both = orchard_eval("--tasks", str(tmp_path), "--attempts", "2", "--rerank", "2")
    assert str(both.exception).startswith("--attempts and --rerank are mutually exclusive")
    assert "give --tasks" in str(orchard_eval("--attempts", "2").exception)


def test_token_counts_read_the_wanted_calls_from_the_episode_start_on_each_bus_backend(
    bus: Bus, unique_name: Callable[[str], str]
) -> None:
    topic, codec, t0 = unique_name("calls"), Codec.default(), 1_700_000_000_000
    bus.create_topic(topic, 2)

    def call(episode_id: str, index: int, prompt: int, completion: int) -> bytes:
        return codec.encode("ModelCall", {
            "run_id": RUN_ID, "episode_id": episode_id, "task_id": "t", "call_index": index, "harness": "builtin",
            "api_flavour": "CHAT", "model": MODEL, "policy_version": 0, "request_messages_json": "[]",
            "response_text": "", "finish_reason": "stop", "prompt_token_ids": pack_token_ids(range(prompt)),
            "completion_token_ids": pack_token_ids(range(completion)),
            "completion_logprobs": pack_logprobs([0.0] * completion), "latency_ms": 1.0, "timestamp": t0,
        })  # fmt: skip

    with bus.producer() as producer:
        # an old call of "a" (before the episodes started: not read), then the episodes' calls and another episode's
        sends = [("a", 9, 1000, 1000, t0 - CLOCK_MARGIN_MS - 60_000), ("a", 0, 10, 2, t0), ("b", 0, 50, 5, t0),
                 ("x", 0, 7, 7, t0), ("a", 1, 20, 3, t0 + 1)]  # fmt: skip
        for episode_id, index, prompt, completion, at in sends:
            producer.produce(topic, call(episode_id, index, prompt, completion), episode_id.encode(), timestamp_ms=at)
        producer.flush()

    started = time.monotonic()
    wanted = read_token_counts(bus, {"a": 2, "b": 1}, deadline=time.monotonic() + 60, since_ms=t0, topic=topic)
    partial = read_token_counts(bus, {"a": 5}, deadline=time.monotonic() + 60, since_ms=t0, topic=topic)

    assert wanted == TokenCount(calls=3, prompt_tokens=80, completion_tokens=10)
    assert partial == TokenCount(calls=2, prompt_tokens=30, completion_tokens=5)  # stopped at the topic's end
    assert time.monotonic() - started < 30
