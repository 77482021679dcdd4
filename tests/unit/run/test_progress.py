"""What a stage's progress is (``orchard.run.progress``): its goals from the recipe, how much is done, the rate and
the ETA. Pure logic: the recipe is file-lookup's, the figures are made up."""

from __future__ import annotations

import doctest
from pathlib import Path

from orchard.run import progress
from orchard.run.config import PolicyTrainerComponent, StageConfig, load_run_config, parse_run_config
from orchard.run.progress import (
    Figures,
    Goal,
    Progress,
    Rates,
    TrainerPoint,
    component_goal,
    eta_text,
    focus_stage,
    goal_total,
    measured,
    stage_goals,
    stage_progress,
    trainer_settings,
)
from orchard.run.stages import StageState

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup" / "recipe.yaml"
ROOT = Path("/runs/file-lookup")


def goals_of(stage: str) -> list[Goal]:
    pinned = ["components.rollout-rl.rounds=8", "components.rollout-dense.rounds=8"]  # tuning moves no figure
    config = load_run_config(RECIPE, sets=pinned)
    return stage_goals(next(s for s in config.stages if s.name == stage), config, ROOT)


def test_the_doctests_of_progress_hold() -> None:
    assert doctest.testmod(progress).failed == 0


def test_the_demos_stage_counts_trajectories_to_its_until_and_episodes_to_the_demonstrations() -> None:
    assert goals_of("demos") == [
        Goal("trajectories", "records", "records", key="trajectories", total=1000),
        Goal("demos", "episodes", "episodes", total_of=ROOT / "demos" / "demonstrations.jsonl"),
    ]


def test_an_rl_stage_counts_rounds_times_budget_episodes_and_the_trainer_steps_of_its_max_steps() -> None:
    assert goals_of("rl-bar") == [
        Goal("rollout-rl", "episodes", "episodes", total=8 * 64),
        Goal(
            "trainer-rl",
            "steps",
            "trainer-step",
            total=6000,
            metrics=ROOT / "trainer-rl" / "metrics.jsonl",
            cap_only=True,
        ),
    ]


def test_a_trainers_max_steps_is_only_a_cap_without_an_eta_when_its_stage_ends_with_something_else() -> None:
    (sft,) = goals_of("sft-successful")  # ends when the trainer exits: its steps have an ETA
    assert not sft.cap_only
    (_, rl) = goals_of("rl-bar")  # ends with its rollout: 6000 steps is a cap, not a prediction
    assert rl.cap_only
    assert eta_text(Progress(rl.label, 1405, 6000, 0.1, cap_only=True)) == "cap"
    assert eta_text(Progress(sft.label, 400, 1000, 2.0)) == "ETA 0:05:00"


def test_an_evaluation_counts_the_tasks_of_its_stage_of_the_eval_split_and_the_value_trainer_its_steps() -> None:
    assert goals_of("eval-rerank") == [
        Goal("eval-rerank", "tasks", "eval-tasks", key="eval-rerank-", total_of=ROOT / "tasks" / "eval")
    ]
    assert goals_of("value") == [Goal("value-trainer", "steps", "published-step", key="value", total=300)]
    assert goals_of("credit-samples") == []  # until: caught_up only


def test_a_rollouts_episodes_cap_its_total() -> None:
    config = parse_run_config({"components": {
        "roll": {"kind": "rollout", "service": "http://x", "tasks": "/t", "rounds": 4, "budget": 32, "episodes": 50},
    }}, "recipe.yaml")  # fmt: skip
    goal = component_goal("roll", config.components["roll"], ROOT)
    assert goal is not None
    assert (goal.total, goal_total(goal, Figures())) == (128, 50)


def test_a_trainers_set_entries_override_its_config_file(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text("max_steps: 40\nrun_dir: /elsewhere\nlr: 0.1\n")
    spec = PolicyTrainerComponent(kind="policy-trainer", config=tmp_path / "trainer.yaml", set=["max_steps=90"])
    assert trainer_settings(spec, ROOT) == (90, Path("/elsewhere"))
    bare = PolicyTrainerComponent(kind="policy-trainer", set=["run_dir={run_dir}/t"])
    assert trainer_settings(bare, ROOT) == (None, ROOT / "t")
    assert component_goal("t", bare, ROOT) is None  # no max_steps: no bar


def test_episodes_and_evaluation_tasks_count_from_the_stage_start_and_only_their_own_groups() -> None:
    evals = [(1100, "eval-a-t1"), (1200, "eval-a-t1"), (1300, "eval-a-t2"), (1400, "eval-b-t3"), (10, "eval-a-t3")]
    figures = Figures(episode_ends_ms=[900, 1000, 1500], eval_ends=evals)
    assert measured(Goal("r", "episodes", "episodes"), figures, since_ms=1000) == 2
    assert measured(Goal("e", "tasks", "eval-tasks", key="eval-a-"), figures, since_ms=1000) == 2
    assert measured(Goal("r", "episodes", "episodes"), figures, since_ms=None) is None


def test_the_eta_is_what_is_left_at_the_rate_seen_over_the_window() -> None:
    stage = StageState(StageConfig(name="rl", components=["r"]), status="running", started_at=0.0)
    goal = Goal("r", "episodes", "episodes", total=100)
    rates = Rates(window_s=60)
    ends = [0] * 10
    assert stage_progress(stage, [goal], Figures(episode_ends_ms=ends), rates, now=0.0) == [
        Progress("r episodes", 10, 100, None)
    ]
    shown = stage_progress(stage, [goal], Figures(episode_ends_ms=ends * 4), rates, now=10.0)
    assert shown == [Progress("r episodes", 40, 100, 3.0)]
    assert (shown[0].eta_s, eta_text(shown[0])) == (20.0, "ETA 0:00:20")
    assert eta_text(Progress("x", 100, 100, None)) == "done"
    assert eta_text(Progress("x", 1, 100, None)) == "ETA -"


def test_a_count_that_goes_back_starts_its_rate_over() -> None:
    rates = Rates()
    assert rates.observe("steps", 500, 0.0) is None
    assert rates.observe("steps", 600, 10.0) == 10.0
    assert rates.observe("steps", 3, 11.0) is None  # a new trainer run: its own steps
    assert rates.observe("steps", 13, 16.0) == 2.0


def test_a_trainer_without_a_metrics_line_yet_shows_zero_steps_and_no_rate() -> None:
    stage = StageState(StageConfig(name="sft", components=["t"]), status="running", started_at=0.0)
    goal = Goal("t", "steps", "trainer-step", total=1000)
    assert stage_progress(stage, [goal], Figures(), Rates(), 0.0) == [Progress("t steps", 0, 1000, None)]
    later = Figures(trainer_points={"t": TrainerPoint(412, 0.41, 5.0)})
    assert stage_progress(stage, [goal], later, Rates(), 0.0) == [Progress("t steps", 412, 1000, None)]


def test_the_stage_shown_is_the_running_or_failed_one_else_the_next() -> None:
    stages = [StageState(StageConfig(name=n)) for n in ("a", "b", "c")]
    stages[0].status = "completed"
    assert focus_stage(stages) is stages[1]
    stages[1].status, stages[2].status = "failed", "pending"
    assert focus_stage(stages) is stages[1]
    for stage in stages:
        stage.status = "completed"
    assert focus_stage(stages) is None


def test_a_trainer_config_file_under_the_run_directory_is_read_from_it(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text("max_steps: 77\nrun_dir: /elsewhere\n")
    spec = PolicyTrainerComponent(kind="policy-trainer", config="{run_dir}/trainer.yaml")
    assert trainer_settings(spec, tmp_path) == (77, Path("/elsewhere"))
