"""The live screen of ``orchard run`` on an 80 x 24 terminal, for the file-lookup recipe part way through.

No processes and no bus: the recipe is loaded as ``orchard run`` loads it, the stages and components are set as the
supervisor would have them, the metrics come from a fake source, and the trainer's ``metrics.jsonl``,
``results.json`` and the task directories are written into a temporary run directory. The last test reads the
metrics from an embedded bus."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, Group

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, OrchardConfig
from orchard.evaluation.results import StageRow, write_table
from orchard.run.config import RunConfig, load_run_config
from orchard.run.live import BusMetrics, LiveView, Metrics, PublishedWeights, counted_total, last_point
from orchard.run.progress import TrainerPoint
from orchard.run.rundir import RunDir
from orchard.run.stages import StageRunner
from orchard.run.supervisor import ComponentState
from orchard.topics import OUTCOMES

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup" / "recipe.yaml"
STAGE_S = 200.0  # each completed stage took this long
RUNNING_S = 724.0  # the running stage began this long ago
EVAL_TASKS = 40


class FakeMetrics:
    """What ``BusMetrics`` gives the view, without a bus."""

    def __init__(self, metrics: Metrics) -> None:
        self.config = OrchardConfig(run_id="file-lookup")
        self.metrics = metrics

    def read(self, *, fresh: bool = False) -> Metrics:
        return self.metrics

    def close(self) -> None:
        pass


def file_lookup() -> RunConfig:
    """file-lookup's recipe at 8 BAR rounds of 64 (the figures below are of those; tuning the recipe moves none)."""
    return load_run_config(RECIPE, sets=["components.rollout-rl.rounds=8", "components.rollout-dense.rounds=8"])


def staged_run(config: RunConfig, running: int) -> StageRunner:
    """The stages before ``running`` completed, that one running (``running == len(stages)``: all completed)."""
    runner = StageRunner(config, probe=None)
    began = time.time() - RUNNING_S - STAGE_S * running
    for index, stage in enumerate(runner.stages):
        if index < running:
            stage.status, stage.started_at, stage.ended_at = "completed", began, began + STAGE_S
            began += STAGE_S
        elif index == running:
            stage.status, stage.started_at = "running", time.time() - RUNNING_S
        stage.first_started_at = stage.started_at
    return runner


def component_states(config: RunConfig, runner: StageRunner) -> list[ComponentState]:
    """As the supervisor has them: what a completed stage waited for exited 0, what it stopped is stopped, the rest
    of it is still up, as are the running stage's components and those no stage lists; pending otherwise."""
    running = next((s.config for s in runner.stages if s.status == "running"), None)
    completed = [s.config for s in runner.stages if s.status == "completed"]
    exited = {name for stage in completed for name in config.stage_exits(stage)}
    stopped = {name for stage in completed for name in stage.stop}
    started = {name for stage in completed for name in stage.components}
    states = []
    for name, spec in config.items():
        state = ComponentState(name, spec.kind, [])
        if name not in config.staged() or (running is not None and name in running.components):
            state.status, state.pid = "healthy", 4000 + len(states)
        elif name in exited:
            state.status, state.exit_code = "exited", 0
        elif name in stopped:
            state.status = "stopped"
        elif name in started:
            state.status, state.pid = "healthy", 4000 + len(states)
        states.append(state)
    return states


def bus_metrics(runner: StageRunner) -> Metrics:
    """The bus as it stands in rl-bar: 213 of its 512 episodes ended, 30 held-out tasks of the current eval done."""
    since = next((s.since_ms for s in runner.stages if s.status == "running"), None) or 0
    return Metrics(
        counts={"model-calls": 23456, "outcomes": 3213, "trajectories": 3213, "samples": 2120, "policy-versions": 9},
        mean_reward=0.412,
        success_rate=0.38,
        outcomes_seen=3213,
        weights={"policy": PublishedWeights("policy", 7, "file:///store/policy/v7/", 1232)},
        episode_ends_ms=[since - 5000, *(since + 10 * i for i in range(213))],  # one ended before the stage
        eval_ends=[(since + i, f"eval-{stage}-t{i:03d}") for stage in ("rl-bar", "credit-sft") for i in range(30)],
    )


def write_run_files(root: Path) -> None:
    """trainer-rl's metrics.jsonl (its last line half written), results.json with two rows, the eval split."""
    (root / "trainer-rl").mkdir(parents=True)
    lines = [json.dumps({"step": step, "loss": 0.05 - step / 1e5, "time": time.time()}) for step in (1232, 1234)]
    (root / "trainer-rl" / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 1235, "lo')
    rows = [StageRow("sft-successful", 500, 175, 0.35, 0.309, 0.393, 0.5, 0.47, 0.53, 88.0),
            StageRow("credit-sft", 500, 206, 0.412, 0.369, 0.456, 0.55, 0.52, 0.58, 91.0)]  # fmt: skip
    write_table(root, rows)
    for i in range(EVAL_TASKS):
        (root / "tasks" / "eval" / f"t{i:03d}").mkdir(parents=True)
        (root / "tasks" / "eval" / f"t{i:03d}" / "task.yaml").write_text(f"id: t{i:03d}\n")


def live_view(root: Path, running: int) -> tuple[LiveView, list[ComponentState]]:
    """A live view of file-lookup in ``root`` with stage ``running`` (0-based) running, on an 80x24 console."""
    config = file_lookup()
    runner = staged_run(config, running)
    console = Console(width=80, height=24, record=True, file=io.StringIO())
    view = LiveView(FakeMetrics(bus_metrics(runner)), runner, RunDir(root), console=console)  # type: ignore[arg-type]
    return view, component_states(config, runner)


def render(view: LiveView, components: list[ComponentState]) -> list[str]:
    """The screen as the terminal shows it, as text."""
    view.console.print(Group(*view.lines(components)))
    return view.console.export_text().splitlines()


def rl_bar_screen(root: Path) -> list[str]:
    """Stage 8/14 (rl-bar) 30 s after the view saw it at 150 episodes and step 1100."""
    write_run_files(root)
    view, components = live_view(root, running=7)
    view.progress.rates.observe("rl-bar/rollout-rl episodes", 150, time.monotonic() - 30)
    view.progress.rates.observe("rl-bar/trainer-rl steps", 1100, time.monotonic() - 30)
    return render(view, components)


def test_the_rl_bar_screen_fits_80_by_24_and_names_the_stage_and_its_description(tmp_path: Path) -> None:
    lines = rl_bar_screen(tmp_path)
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80
    assert re.fullmatch(r"orchard file-lookup · stage 8/14 rl-bar 0:12:0\d · run 0:00:0\d", lines[0])
    assert lines[1] == "  (c) + RL on the policy's own episodes, groups sized by Balanced Adaptive"
    assert lines[2] == "  Rollout."


def test_each_goal_of_the_running_stage_has_a_bar_with_its_eta(tmp_path: Path) -> None:
    lines = rl_bar_screen(tmp_path)
    episodes = next(line for line in lines if line.startswith("  rollout-rl episodes "))
    steps = next(line for line in lines if line.startswith("  trainer-rl steps "))
    # 213 of 8 rounds x 64, 63 in the last 30 s: 299 left at 2.1 per second
    assert re.search(r" ━+─+ 213/512  42%  2\.1/s  ETA 0:02:2\d$", episodes), episodes
    # its last complete line; 6000 is max_steps, a cap: rl-bar ends with its rollout, so no ETA toward it
    assert re.search(r" ━+─+ 1234/6000  21%  4\.5/s  cap$", steps), steps


def test_the_screen_shows_the_latest_loss_reward_success_and_held_out_figure(tmp_path: Path) -> None:
    lines = rl_bar_screen(tmp_path)
    assert "loss 0.0377 (trainer-rl step 1234) · reward 0.412 · success 38% (last 100)" in lines
    assert "held-out credit-sft 41.2% [36.9%, 45.6%] of 500 · before: sft-successful 35.0%" in lines
    assert lines[-1] == "calls 23.5k · episodes 3213 · trajectories 3213 · samples 2120 · policy v7"


def test_completed_stages_are_one_line_each_and_the_running_stage_lists_its_components(tmp_path: Path) -> None:
    lines = rl_bar_screen(tmp_path)
    stage_lines = [line for line in lines if re.match(r" [✓▸·] ", line)]
    assert [line.split()[2] for line in stage_lines[:8]] == ["setup", "demos", "sft-successful",
        "eval-sft-successful", "credit-samples", "credit-sft", "eval-credit-sft", "rl-bar"]  # fmt: skip
    assert " ✓  2 demos               0:03:20  6 components: 5 stopped, 1 exited" in lines
    folded = ("expert ", "builder-sft ", "step-reward-demos ")  # in "demos"
    assert not any(line.strip().startswith(folded) for line in lines)
    rows = [line.split()[:2] for line in lines if line.startswith("      ")]
    assert rows == [["policy-proxy", "healthy"], ["rl-env", "healthy"], ["rollout-rl", "healthy"],
                    ["builder-rl", "healthy"], ["trainer-rl", "healthy"]]  # fmt: skip
    assert " · 9-14 next: eval-rl-bar, dense, eval-dense, value, eval-rerank, report" in lines
    assert "   run-wide: assembler healthy, engine healthy" in lines


def test_the_oldest_completed_stages_fold_into_one_line_when_the_screen_is_full(tmp_path: Path) -> None:
    view, components = live_view(tmp_path, running=9)  # dense: 9 stages done, 6 components, a 2-line description
    lines = render(view, components)
    assert len(lines) == 24
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("orchard file-lookup · stage 10/14 dense ")
    assert " ✓ 1-3 setup, demos, sft-successful" in lines
    assert sum(line.startswith(" ✓ ") for line in lines) == 7  # the folded line and stages 4 to 9
    assert "  done when" not in "\n".join(lines)  # it has bars instead
    assert any(line.startswith("  rollout-dense episodes ") and " 213/512 " in line for line in lines)


def test_an_evaluation_stage_counts_its_tasks_done_of_the_eval_split(tmp_path: Path) -> None:
    write_run_files(tmp_path)
    view, components = live_view(tmp_path, running=8)  # eval-rl-bar: 30 of its tasks have an episode
    lines = render(view, components)
    bar = next(line for line in lines if line.startswith("  eval-rl-bar tasks "))
    assert re.search(rf" ━+─+ 30/{EVAL_TASKS}  75%  ETA -$", bar), bar  # no rate yet: one look only


def test_a_stage_without_a_target_says_when_it_is_done(tmp_path: Path) -> None:
    view, components = live_view(tmp_path, running=4)  # credit-samples
    lines = render(view, components)
    assert lines[0].startswith("orchard file-lookup · stage 5/14 credit-samples ")
    assert "  done when sample-builder-credit caught up" in lines


@pytest.mark.parametrize("running", range(15))
def test_every_stage_of_file_lookup_fits_80_by_24(tmp_path: Path, running: int) -> None:
    write_run_files(tmp_path)
    view, components = live_view(tmp_path, running)
    lines = render(view, components)
    assert len(lines) <= 24
    assert max(len(line) for line in lines) <= 80


def test_all_stages_completed_are_told_in_the_header(tmp_path: Path) -> None:
    view, components = live_view(tmp_path, running=14)
    lines = render(view, components)
    assert re.fullmatch(r"orchard file-lookup · 14/14 stages completed · run 0:00:0\d", lines[0])
    assert " ✓ 14 report              0:03:20  1 component exited" in lines


def test_a_recipe_without_stages_folds_the_components_past_the_screen_into_one_line(tmp_path: Path) -> None:
    config = file_lookup().model_copy(update={"stages": []})
    console = Console(width=80, height=24, record=True, file=io.StringIO())
    runner = StageRunner(config, probe=None)
    view = LiveView(FakeMetrics(Metrics()), runner, RunDir(tmp_path), console=console)  # type: ignore[arg-type]
    components = [ComponentState(name, spec.kind, [], status="healthy", pid=1) for name, spec in config.items()]
    lines = render(view, components)
    rows = [line.split()[0] for line in lines if line.endswith(" healthy   pid 1")]
    assert len(lines) == 24
    assert rows == [c.name for c in components[: len(rows)]]
    assert lines[-2] == f" +{len(components) - len(rows)} more: {len(components) - len(rows)} up"
    assert lines[-1] == "calls 0 · episodes 0 · trajectories 0 · samples 0"


def test_last_point_is_the_last_complete_metrics_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert last_point(path) is None
    path.write_text('{"step": 1, "loss": 0.5, "time": 10.0}\n{"step": 2, "time": 11.0}\n{"step": 3, "lo')
    assert last_point(path) == TrainerPoint(2, None, 11.0)


def test_a_total_counts_demonstrations_or_task_directories_and_is_none_before_they_exist(tmp_path: Path) -> None:
    assert counted_total(tmp_path / "demos" / "demonstrations.jsonl") is None
    assert counted_total(tmp_path / "tasks" / "eval") is None
    (tmp_path / "demos").mkdir()
    (tmp_path / "demos" / "demonstrations.jsonl").write_text('{"a": 1}\n{"a": 2}\n\n')
    write_run_files(tmp_path)
    assert counted_total(tmp_path / "demos" / "demonstrations.jsonl") == 2
    assert counted_total(tmp_path / "tasks" / "eval") == EVAL_TASKS


def outcome(episode_id: str, run_id: str, group_id: str, ended_at: int, success: bool) -> dict[str, Any]:
    return {"run_id": run_id, "episode_id": episode_id, "task_id": "t1", "group_id": group_id,
            "status": "SUCCEEDED" if success else "FAILED", "reward": float(success), "success": success,
            "signals": {}, "num_model_calls": 2, "artifact_uris": [], "policy_version": None,
            "started_at": ended_at - 1000, "ended_at": ended_at, "error": None}  # fmt: skip


def test_bus_metrics_note_when_this_runs_training_and_evaluation_episodes_ended(tmp_path: Path) -> None:
    config = OrchardConfig(run_id="file-lookup", bus=EmbeddedBusConfig(path=tmp_path / "bus"))
    records = [
        outcome("e1", "file-lookup", "g-t1", 1_000, True),
        outcome("e2", "file-lookup", "eval-a-t1", 2_000, False),
        outcome("e3", "another-run", "g-t1", 3_000, True),  # another run on the same bus: not counted
        outcome("e4", "file-lookup", "g-t1", 4_000, False),
    ]
    codec = Codec.default()
    with open_bus(config.bus) as bus:
        bus.create_topic(OUTCOMES, exist_ok=True)
        with bus.producer() as producer:
            for record in records:
                producer.send(OUTCOMES, codec.encode("EpisodeOutcome", record), key=record["episode_id"].encode())
    metrics = BusMetrics(config)
    try:
        read = metrics.read(fresh=True)
    finally:
        metrics.close()
    assert (read.episode_ends_ms, read.eval_ends) == ([1_000, 4_000], [(2_000, "eval-a-t1")])
    assert (read.outcomes_seen, read.mean_reward, read.success_rate) == (3, 1 / 3, 1 / 3)
