"""The file-lookup recipe as ``orchard run`` reads it: a valid RunConfig whose stages, commands, trainer overrides and
sample-builder settings are consistent with each other and with the recorded task and expert options (which the setup
command runs with: its own options, or the run's copy of the recipe with ``--recipe``); the setup command writes the
tasks and plans and can run again on its own output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from consumers.samples import SampleBuilderConfig
from orchard.run.commands import component_command
from orchard.run.config import (
    CommandComponent,
    ConsumerComponent,
    EnvComponent,
    PolicyTrainerComponent,
    RunConfig,
    load_run_config,
)
from recipes.file_lookup.evaluate import main as evaluate_main
from recipes.file_lookup.expert import ExpertConfig
from recipes.file_lookup.generate import LookupConfig
from recipes.file_lookup.setup import setup, setup_arguments
from tests.unit.recipes.run_copy import setup_in_run
from trainers.config import load_trainer_config

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup" / "recipe.yaml"


@pytest.fixture(scope="module")
def recipe() -> RunConfig:
    return load_run_config(RECIPE)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(RECIPE.read_text())
    return data


def options(words: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line."""
    return {word[2:].replace("-", "_"): words[i + 1] for i, word in enumerate(words) if word.startswith("--")}


def test_the_recipe_validates_and_runs_every_training_stage_each_followed_by_a_held_out_evaluation(
    recipe: RunConfig,
) -> None:
    assert [stage.name for stage in recipe.stages] == [
        "setup", "demos", "sft-successful", "eval-sft-successful", "credit-samples", "credit-sft", "eval-credit-sft",
        "rl-bar", "eval-rl-bar", "dense", "eval-dense", "value", "eval-rerank", "report",
    ]  # fmt: skip
    assert recipe.recipe == "file_lookup" and recipe.harness == "builtin"


def test_the_setup_command_generates_exactly_the_recorded_task_and_expert_options(
    recipe: RunConfig, raw: dict[str, Any], tmp_path: Path
) -> None:
    spec = recipe.components["setup"]
    assert isinstance(spec, CommandComponent)
    assert spec.run[:3] == ["python", "-m", "recipes.file_lookup.setup"]
    # what the command runs with inside the run (its options, or the run's copy of the recipe with --recipe)
    given = setup_arguments(setup_in_run(recipe, "setup", tmp_path))
    tasks = {k: v for k, v in raw["tasks"].items() if k not in ("generator", "dir")}
    assert given["lookup"] == LookupConfig(**tasks) and given["lookup"].eval_tasks >= 200
    expert = raw["expert"]
    assert (given["expert"].imperfect_fraction, given["expert"].seed, given["episodes_per_task"]) == (
        expert["imperfect_fraction"], expert["seed"], expert["episodes_per_task"],
    )  # fmt: skip
    demos = next(stage for stage in recipe.stages if stage.name == "demos")
    assert demos.until is not None and demos.until.count == tasks["train_tasks"] * expert["episodes_per_task"]


def test_the_eval_env_serves_the_held_out_split_and_both_evaluations_go_through_it_to_the_reloading_engine(
    recipe: RunConfig, tmp_path: Path
) -> None:
    eval_env, train_env = recipe.components["eval-env"], recipe.components["env"]
    assert isinstance(eval_env, EnvComponent) and isinstance(train_env, EnvComponent)
    assert (str(eval_env.tasks), str(train_env.tasks)) == ("{run_dir}/tasks/eval", "{run_dir}/tasks/train")
    assert eval_env.proxy == "policy-proxy" and recipe.components["policy-proxy"].backend == "engine"  # type: ignore[union-attr]
    engine = recipe.components["engine"]
    assert engine.reload  # type: ignore[union-attr]
    for stage in ("sft-successful", "credit-sft", "rl-bar", "dense", "rerank"):
        assert recipe.dependencies(f"eval-{stage}") == ["eval-env"]
        command = component_command(f"eval-{stage}", recipe.components[f"eval-{stage}"], recipe, tmp_path)
        inner = command[command.index("--") + 1 :]
        assert inner[:2] == ["orchard", "eval"]
        given = options(inner)
        assert (given["tasks"], given["stage"], given["run_dir"]) == (f"{tmp_path}/tasks/eval", stage, str(tmp_path))
        assert given["env"] == f"http://127.0.0.1:{eval_env.port}"
        assert options(command[: command.index("--")])["engine"] == f"http://127.0.0.1:{engine.listen_port()}"


def test_both_trainers_resolve_to_sft_on_the_engines_model_the_credit_one_resuming_the_first(
    recipe: RunConfig, tmp_path: Path
) -> None:
    configs = {}
    for name in ("trainer", "trainer-credit"):
        spec = recipe.components[name]
        assert isinstance(spec, PolicyTrainerComponent)
        configs[name] = load_trainer_config(None, [item.replace("{run_dir}", str(tmp_path)) for item in spec.set])
    first, credit = configs["trainer"], configs["trainer-credit"]
    assert first.loss.kind == credit.loss.kind == "sft"
    assert first.model == credit.model and first.model.name == recipe.components["engine"].model  # type: ignore[union-attr]
    # same run, model name and consumer group: the credit trainer restores the first one's checkpoint
    assert (first.model_name, first.group_id) == (credit.model_name, credit.group_id)
    assert first.max_steps is not None and credit.max_steps is not None and credit.max_steps > first.max_steps
    # each trains its stage's samples once they are all on the bus: no idle time decides what or how long
    assert first.input == credit.input == "complete" and first.idle_exit_s is None and credit.idle_exit_s is None
    assert first.epochs == credit.epochs == 3


def test_the_rl_trainers_resume_the_sft_checkpoint_with_their_own_constant_learning_rate(
    recipe: RunConfig, tmp_path: Path
) -> None:
    configs = {}
    for name in ("trainer-credit", "trainer-rl", "trainer-dense"):
        spec = recipe.components[name]
        assert isinstance(spec, PolicyTrainerComponent)
        configs[name] = load_trainer_config(None, [item.replace("{run_dir}", str(tmp_path)) for item in spec.set])
    credit, rl, dense = configs["trainer-credit"], configs["trainer-rl"], configs["trainer-dense"]
    assert rl.loss.kind == dense.loss.kind == "rl"
    assert (credit.model_name, credit.group_id) == (rl.model_name, rl.group_id) == (dense.model_name, dense.group_id)
    assert rl.lr < credit.lr and rl.schedule.kind == dense.schedule.kind == "constant"
    assert credit.max_steps is not None and rl.max_steps is not None and dense.max_steps is not None
    assert credit.max_steps < rl.max_steps < dense.max_steps  # max_steps counts from the first stage
    assert rl.staleness.max_policy_lag is not None and rl.stage_optimizer == dense.stage_optimizer == "fresh"
    # no idle time ends them: each stage ends once its rollout's samples are all on the bus, and its stop drains it
    assert rl.idle_exit_s is None and dense.idle_exit_s is None
    stages = {stage.name: stage for stage in recipe.stages}
    for stage, trainer in (("rl-bar", "trainer-rl"), ("dense", "trainer-dense")):
        assert stages[stage].until is not None and stages[stage].until.caught_up == ["sample-builder-rl"]
        assert stages[stage].stop[0] == trainer and recipe.components[trainer].stop_grace_s >= 300


def test_the_rl_builders_close_bar_groups_and_the_dense_one_weighs_the_step_reward_plug_in(recipe: RunConfig) -> None:
    from recipes.file_lookup.step_reward import FileLookupSteps

    rl, dense, plug_in = (recipe.components[name] for name in ("builder-rl", "builder-dense", "step-reward"))
    assert isinstance(rl, ConsumerComponent) and isinstance(dense, ConsumerComponent)
    assert isinstance(plug_in, ConsumerComponent)
    assert rl.group == dense.group  # the dense stage continues where RL stopped
    rl_config, dense_config = builder_config(rl), builder_config(dense)
    assert rl_config.kinds == dense_config.kinds == ["RL"] and not rl_config.scorers
    rollout = recipe.components["rollout-rl"]
    assert rl_config.group_size == rollout.max_rollouts  # type: ignore[union-attr]
    assert list(dense_config.scorers) == [FileLookupSteps.name] and plug_in.name.endswith(":FileLookupSteps")
    stages = {stage.name: stage for stage in recipe.stages}
    assert {"builder-rl", "rl-env"} <= set(stages["rl-bar"].stop)
    assert {"builder-dense", "step-reward", "rl-env"} <= set(stages["dense"].stop)


def builder_config(spec: ConsumerComponent) -> SampleBuilderConfig:
    """The sample builder's settings from the component's ORCHARD_CONSUMERS__SAMPLE_BUILDER__* variables."""
    prefix = "ORCHARD_CONSUMERS__SAMPLE_BUILDER__"
    data: dict[str, Any] = {}
    for key, value in spec.env.items():
        assert key.startswith(prefix), key
        *parents, leaf = key[len(prefix) :].lower().split("__")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = json.loads(value) if value[:1] in "[{" else value
    return TypeAdapter(SampleBuilderConfig).validate_python(data)


def test_the_builders_make_sft_on_successful_demos_only_and_credit_sft_on_all_with_the_progress_signal(
    recipe: RunConfig,
) -> None:
    sft, credit = recipe.components["builder-sft"], recipe.components["builder-credit"]
    assert isinstance(sft, ConsumerComponent) and isinstance(credit, ConsumerComponent)
    assert sft.group != credit.group  # each reads every trajectory
    sft_config, credit_config = builder_config(sft), builder_config(credit)
    assert (sft_config.kinds, sft_config.sft_successful_only) == (["SFT"], True)
    assert (credit_config.kinds, credit_config.sft_successful_only) == (["SFT"], False)
    assert credit_config.credit.progress_signals == ["progress"]
    stages = {stage.name: stage for stage in recipe.stages}
    # each builder runs in a stage of its own before its trainer's, which ends once it has caught up: the SFT
    # stage's samples are then complete, and nothing writes samples while a trainer reads them
    assert "builder-sft" in stages["demos"].components and "builder-sft" in stages["demos"].stop
    assert stages["demos"].until is not None and stages["demos"].until.caught_up == [sft.group]
    assert stages["credit-samples"].components == stages["credit-samples"].stop == ["builder-credit"]
    assert stages["credit-samples"].until is not None and stages["credit-samples"].until.caught_up == [credit.group]
    assert stages["sft-successful"].components == ["trainer"] and stages["credit-sft"].components == ["trainer-credit"]


def test_setup_writes_tasks_and_plans_and_a_second_run_keeps_the_tasks(tmp_path: Path) -> None:
    lookup = LookupConfig(train_tasks=3, eval_tasks=2)
    tasks, demos = setup(tmp_path, lookup, ExpertConfig(imperfect_fraction=0.0))
    assert sorted(p.name for p in (tasks / "train").iterdir()) == [f"file-lookup-train-{i:05d}" for i in range(3)]
    assert len((demos / "demonstrations.jsonl").read_text().splitlines()) == 3
    before = (tasks / "manifest.json").stat().st_mtime_ns
    setup(tmp_path, lookup, ExpertConfig(imperfect_fraction=0.0))
    assert (tasks / "manifest.json").stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="other options"):
        setup(tmp_path, lookup.model_copy(update={"eval_tasks": 5}), ExpertConfig())


def test_the_evaluation_wrapper_refuses_to_run_without_a_command(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        evaluate_main(["--engine", "http://127.0.0.1:9", "--run-dir", str(tmp_path), "--"])


def test_the_value_model_starts_from_the_model_the_policy_trainers_publish(recipe: RunConfig, tmp_path: Path) -> None:
    dense = recipe.components["trainer-dense"]
    assert isinstance(dense, PolicyTrainerComponent)
    published = load_trainer_config(None, [item.replace("{run_dir}", str(tmp_path)) for item in dense.set]).model_name
    assert recipe.components["value-trainer"].model == f"policy:{published}"  # type: ignore[union-attr]
