"""``orchard eval --tasks``: a held-out evaluation through a real Orchard Env service (REST, scheduler, local
sandboxes, the built-in harness, the recording proxy, the recipe's grader) on the file-lookup eval split, the
scripted expert solving some tasks and failing others; the run's results table gets the stage's success rate and
Wilson interval, and ``orchard eval --plot`` draws the reward curve from the same bus."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
from orchard.env.episode_runner import LocalEpisodeRunner, ProxyAdmin
from orchard.env.local_runtime import LocalRuntime
from orchard.env.scheduler import Scheduler
from orchard.env.service import create_env_app
from orchard.env.tasks import TaskCatalog
from orchard.evaluation.heldout import eval_episode_id
from orchard.evaluation.stats import wilson_interval
from orchard.topics import OUTCOMES, STANDARD_TOPICS
from producers.proxy import BackgroundServer, ProxySettings, create_proxy_app
from recipes.file_lookup.expert import DemoKind, Expert, ExpertBackend
from recipes.file_lookup.generate import LookupConfig, LookupTask, generate

pytestmark = [pytest.mark.harness]
RUN_ID = "heldout-run"
MODEL = "file-lookup-expert"
ADMIN = "admin-secret-0123456789"  # noqa: S105 - test tokens
ENV_TOKEN = "env-secret-0123456789"  # noqa: S105
STAGE = "sft"
KINDS = [DemoKind.PERFECT, DemoKind.WRONG_KEY, DemoKind.PERFECT, DemoKind.NO_ANSWER]
"""What the expert does on eval tasks 0..3: two solved, two failed (rewards 1, 0, 1, 0)."""


@pytest.fixture
def env_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """The eval split, the expert (a plan per evaluation episode id), the proxy, and the Env service on an embedded
    bus; the run directory's orchard.yaml names that bus."""
    monkeypatch.setattr("orchard.cli.common.configure_logging", lambda *args, **kwargs: None)
    generate(LookupConfig(train_tasks=0, eval_tasks=len(KINDS)), tmp_path / "tasks")
    eval_dir = tmp_path / "tasks" / "eval"
    backend, expert = ExpertBackend(model=MODEL, policy_version=3), Expert()
    for directory, kind in zip(sorted(eval_dir.iterdir()), KINDS, strict=True):
        task = LookupTask.from_directory(directory)
        episode_id = eval_episode_id(RUN_ID, STAGE, task.task_id, 0)
        backend.register(episode_id, expert.demonstrate(task, episode_id, kind).plan)
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
    assert "| sft | 4 | 50.0% (2/4) | [15.0%, 85.0%] |" in (run_dir / "results.md").read_text()
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


def test_heldout_evaluation_names_every_missing_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCHARD_ENV_TOKEN", raising=False)

    result = orchard_eval("--tasks", str(tmp_path), "--model", "m")

    assert result.exit_code != 0
    assert str(result.exception) == (
        "a held-out evaluation (--tasks) also needs --env, --env-token (or ORCHARD_ENV_TOKEN), --stage, --run-dir"
    )
    assert "--plot needs --run-dir" in str(orchard_eval("--plot").exception)
