"""The file-lookup validation split: the train stream's next tasks, none a train or eval task, written once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recipes.file_lookup.generate import LookupConfig, LookupTask, generate_tasks
from recipes.file_lookup.validation import main, write_validation

CONFIG = LookupConfig(seed=3, train_tasks=20, eval_tasks=6)


def read_split(directory: Path) -> list[LookupTask]:
    return [LookupTask.from_directory(path) for path in sorted(directory.iterdir()) if path.is_dir()]


def test_the_split_is_the_train_streams_next_tasks_and_repeats_no_train_or_eval_task(tmp_path: Path) -> None:
    ids = write_validation(CONFIG, tmp_path / "validation", 5)

    assert ids == [f"file-lookup-train-{index:05d}" for index in range(20, 25)]
    carved = read_split(tmp_path / "validation")
    assert [task.task_id for task in carved] == ids
    drawn = generate_tasks(CONFIG)
    seen = {task.fingerprint for split in drawn.values() for task in split}
    assert not seen & {task.fingerprint for task in carved}
    longer = generate_tasks(CONFIG.model_copy(update={"train_tasks": 25}))["train"]
    assert longer[:20] == drawn["train"] and longer[20:] == carved  # the train split itself is unchanged


def test_a_written_split_is_kept_and_one_with_other_options_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "validation"
    first = write_validation(CONFIG, out, 4)
    (out / first[0] / "marker").write_text("kept")
    assert write_validation(CONFIG, out, 4) == first and (out / first[0] / "marker").is_file()
    with pytest.raises(ValueError, match="written with other options"):
        write_validation(CONFIG.model_copy(update={"seed": 4}), out, 4)


def test_the_command_reads_the_recipes_tasks_block_and_an_option_still_wins(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"tasks": {"generator": "recipes.file_lookup.generate", "dir": "tasks",
                                                "seed": 3, "train_tasks": 20, "eval_tasks": 6}}))  # fmt: skip
    assert main([str(tmp_path / "a"), "--tasks", "3", "--recipe", str(recipe)]) == 0
    assert [task.task_id for task in read_split(tmp_path / "a" / "validation")] == [
        f"file-lookup-train-{index:05d}" for index in range(20, 23)
    ]
    assert main([str(tmp_path / "b"), "--tasks", "2", "--recipe", str(recipe), "--train-tasks", "10"]) == 0
    assert read_split(tmp_path / "b" / "validation")[0].task_id == "file-lookup-train-00010"
    recipe.write_text(yaml.safe_dump({"tasks": {"train_taskz": 20}}))
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "c"), "--recipe", str(recipe)])
    assert exit_info.value.code == 2


def test_the_ablation_overlay_runs_through_b_then_rl_each_evaluated_on_the_validation_split() -> None:
    from orchard.run.config import load_run_config

    folder = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup"
    sets = ["components.trainer-rl.params.lr=5e-5", "components.rollout-rl.rounds=16"]
    config = load_run_config(folder / "recipe.yaml", [folder / "overlays" / "ablation.yaml"], sets)
    assert [stage.name for stage in config.stages] == [
        "setup", "demos", "sft-successful", "credit-samples", "credit-sft", "validation-credit-sft", "rl-bar",
        "validation-rl-bar",
    ]  # fmt: skip
    trainer = config.components["trainer-rl"].set
    assert trainer[2] == "lr=5e-5"  # a param (stop 38); README rows set others by index
    assert trainer[3].startswith("schedule=") and trainer[12] == "loss.skip_zero_advantage=true"
    assert config.components["rollout-rl"].rounds == 16
    assert sorted(set(config.components) - config.staged()) == ["assembler", "engine"]  # nothing else runs
    evaluation = config.components["validation-rl-bar"].run
    assert evaluation[evaluation.index("--tasks") + 1] == "{run_dir}/validation"


def test_the_version_curve_overlay_pins_the_engine_and_evaluates_that_version_alone() -> None:
    from orchard.run.config import load_run_config

    folder = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup"
    sets = ["components.engine.args=[--max-version, '44']", "components.validation-version.params.version=44",
            "stages.1.name=validation-v44"]  # fmt: skip
    config = load_run_config(folder / "recipe.yaml", [folder / "overlays" / "version-curve.yaml"], sets)
    assert [stage.name for stage in config.stages] == ["validation-setup", "validation-v44"]
    assert config.components["engine"].args == ["--max-version", "44"] and config.components["engine"].reload
    evaluation = config.components["validation-version"].run
    assert evaluation[evaluation.index("--policy-version") + 1] == "44"
    assert evaluation[evaluation.index("--stage") + 1] == "validation-v44"
    assert evaluation[evaluation.index("--tasks") + 1] == "{run_dir}/validation"
    assert sorted(set(config.components) - config.staged()) == ["assembler", "engine"]  # nothing else runs


def test_the_validation_overlay_runs_every_stage_and_evaluates_each_on_the_validation_split_only() -> None:
    from orchard.run.config import load_run_config

    folder = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup"
    base = load_run_config(folder / "recipe.yaml", [], [])
    config = load_run_config(folder / "recipe.yaml", [folder / "overlays" / "validation.yaml"], ["tasks.hops=2"])
    assert [stage.name for stage in config.stages] == [stage.name for stage in base.stages]
    setup = config.components["setup"].run
    assert setup[setup.index("--validation-tasks") + 1] == "500"
    assert str(config.components["eval-env"].tasks) == "{run_dir}/validation"
    evaluations = [name for name in base.components if name.startswith("eval-") and name != "eval-env"]
    assert len(evaluations) == 5
    for name in evaluations:  # the recipe's command, but for the tasks it reads
        run, held_out = config.components[name].run, base.components[name].run
        where = run.index("--tasks") + 1
        assert run[where] == "{run_dir}/validation" and held_out[where] == "{run_dir}/tasks/eval"
        assert run[:where] + run[where + 1 :] == held_out[:where] + held_out[where + 1 :]


def test_setup_writes_the_validation_split_when_asked(tmp_path: Path) -> None:
    from recipes.file_lookup.setup import main as setup_main

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"tasks": {"seed": 3, "train_tasks": 20, "eval_tasks": 6}}))
    assert setup_main([str(tmp_path / "run"), "--recipe", str(recipe), "--validation-tasks", "3"]) == 0
    assert [task.task_id for task in read_split(tmp_path / "run" / "validation")] == [
        f"file-lookup-train-{index:05d}" for index in range(20, 23)
    ]
    assert setup_main([str(tmp_path / "none"), "--recipe", str(recipe)]) == 0
    assert not (tmp_path / "none" / "validation").exists()


def test_the_budget_overlay_caps_the_sft_steps_and_the_rl_rounds_halves_the_dense_lr_and_changes_nothing_else() -> None:
    from orchard.run.config import load_run_config

    folder = Path(__file__).resolve().parents[3] / "recipes" / "file_lookup"
    shipped = load_run_config(folder / "recipe.yaml", [], [])
    budget = load_run_config(folder / "recipe.yaml", [folder / "overlays" / "budget.yaml"], [])

    assert "max_steps=300" in budget.components["trainer"].set
    assert "max_steps=400" in budget.components["trainer-credit"].set
    assert (shipped.components["rollout-rl"].rounds, budget.components["rollout-rl"].rounds) == (32, 8)
    assert "lr=5e-5" in budget.components["trainer-dense"].set and "lr=1e-4" in budget.components["trainer-rl"].set
    changed = {name for name in shipped.components if shipped.components[name] != budget.components[name]}
    assert changed == {"trainer", "trainer-credit", "rollout-rl", "trainer-dense"}
    assert [stage.name for stage in budget.stages] == [stage.name for stage in shipped.stages]
