"""The setup stages read the recipe instead of repeating it (``--recipe``, ``recipes.recipe_settings``): the options'
defaults come from the recipe's ``tasks:`` and ``expert:`` blocks, an option on the command line still wins, a key
no setup knows (or a value of the wrong type) is refused naming the key and the file, and an overlay or ``--set``
reaches the setup stage through the run's copy of the recipe. Each shipped setup command runs with exactly the
settings its command line used to spell out."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from orchard.run.config import CommandComponent, load_run_config
from recipes.claw import setup as claw_setup
from recipes.claw.tasks import ClawConfig
from recipes.file_lookup import setup as file_lookup_setup
from recipes.file_lookup.expert import ExpertConfig
from recipes.file_lookup.generate import LookupConfig
from recipes.gui import setup as gui_setup
from recipes.gui.tasks import SuiteConfig
from recipes.swe import setup as swe_setup
from recipes.swe import swebench_build
from recipes.swe.build import BuildConfig
from tests.unit.recipes.run_copy import module_argv, setup_in_run, write_run_copy

ROOT = Path(__file__).resolve().parents[3]
CLAW = ROOT / "recipes" / "claw" / "recipe.yaml"
SHIPPED: dict[str, tuple[Path, ModuleType, dict[str, Any]]] = {
    # what each setup command spelled out before it read the recipe (git 2c776ea), as setup()'s arguments
    "file_lookup": (
        ROOT / "recipes" / "file_lookup" / "recipe.yaml",
        file_lookup_setup,
        {
            "lookup": LookupConfig(seed=0, train_tasks=1000, eval_tasks=500, files_per_task=3, keys_per_file=1,
                                   max_steps=6, value_min=500),  # value_min: stop 28
            "expert": ExpertConfig(seed=0, imperfect_fraction=0.3),
            "episodes_per_task": 1,
            "validation_tasks": 0,  # the held-out run writes no validation split (overlays/validation.yaml does)
        },
    ),
    "claw": (
        CLAW,
        claw_setup,
        {
            "config": ClawConfig(seed=0, train_per_kind=8, eval_per_kind=2, max_steps=12),
            "episodes_per_task": 1,
            "wrong_fraction": 0.25,
            "expert_seed": 0,
        },
    ),
    "gui": (
        ROOT / "recipes" / "gui" / "recipe.yaml",
        gui_setup,
        {
            "config": gui_setup.GuiSetupConfig(
                suite=SuiteConfig(seed=0, train_per_family=8, eval_per_family=4, max_steps=8, harness_timeout_s=240,
                                  grade_timeout_s=30),
                families=gui_setup.CPU_FAMILIES,
            ),
            "demos": gui_setup.DemoConfig(episodes_per_task=2, failing_fraction=0.3, seed=0),
        },
    ),
    "swe-local": (
        ROOT / "recipes" / "swe" / "local.yaml",
        swe_setup,
        {
            "suite": swe_setup.SUITE,
            "build_config": BuildConfig(max_steps=16, harness_timeout_s=900, grade_timeout_s=300,
                                        python=sys.executable),
            "demos": swe_setup.DemoConfig(harness="builtin", episodes_per_task=2, failing_fraction=0.3, seed=0,
                                          python=sys.executable),
        },
    ),
}  # fmt: skip
UNKNOWN_KEYS: list[tuple[ModuleType, dict[str, Any], str]] = [
    (file_lookup_setup, {"tasks": {"train_taks": 10}}, "tasks.train_taks"),
    (claw_setup, {"expert": {"imperfect_fraction": 0.3}}, "expert.imperfect_fraction"),  # file_lookup's, not claw's
    (gui_setup, {"tasks": {"family": ["docs_error"]}}, "tasks.family"),
    (swe_setup, {"expert": {"seed": 0, "harness": "codex"}}, "expert.harness"),  # the recipe's top-level key
    (swebench_build, {"tasks": {"repos": "/r", "image": "x"}}, "tasks.image"),
]


def write_recipe(folder: Path, **blocks: Any) -> Path:
    """A recipe file holding ``blocks`` (a setup reads nothing else)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(blocks, sort_keys=False))
    return path


def refusal(module: ModuleType, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``module``'s command line says on stderr when it exits 2 for ``argv``."""
    with pytest.raises(SystemExit) as exited:
        module.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- --recipe
def test_the_setup_takes_its_options_from_the_recipes_tasks_and_expert_blocks(tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path,
        tasks={"generator": "recipes.claw.tasks", "seed": 3, "train_per_kind": 2, "eval_per_kind": 1, "max_steps": 14},
        expert={"module": "recipes.claw.expert", "seed": 5, "episodes_per_task": 2, "wrong_fraction": 0.5},
    )
    assert claw_setup.setup_arguments([str(tmp_path / "run"), "--recipe", str(recipe)]) == {
        "run_dir": tmp_path / "run",
        "config": ClawConfig(seed=3, train_per_kind=2, eval_per_kind=1, max_steps=14),
        "episodes_per_task": 2,
        "wrong_fraction": 0.5,
        "expert_seed": 5,
    }


def test_an_option_on_the_command_line_wins_over_the_recipe_and_what_neither_gives_keeps_its_default(
    tmp_path: Path,
) -> None:
    recipe = write_recipe(tmp_path, tasks={"train_tasks": 40, "eval_tasks": 20}, expert={"seed": 5})
    given = file_lookup_setup.setup_arguments(
        ["--train-tasks", "7", str(tmp_path / "run"), "--recipe", str(recipe), "--expert-seed", "9"]
    )
    assert given == {
        "run_dir": tmp_path / "run",
        "lookup": LookupConfig(train_tasks=7, eval_tasks=20),
        "expert": ExpertConfig(seed=9),
        "episodes_per_task": 1,
        "validation_tasks": 0,
    }


def test_the_recipes_hops_key_reaches_the_file_lookup_setup_and_the_hops_option_still_wins(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, tasks={"train_tasks": 4, "eval_tasks": 2, "hops": 2})
    run = str(tmp_path / "run")
    assert file_lookup_setup.setup_arguments([run, "--recipe", str(recipe)])["lookup"].hops == 2
    assert file_lookup_setup.setup_arguments([run, "--recipe", str(recipe), "--hops", "1"])["lookup"].hops == 1


@pytest.mark.parametrize(("module", "blocks", "key"), UNKNOWN_KEYS, ids=lambda v: getattr(v, "__name__", None))
def test_an_unknown_key_is_refused_naming_the_key_and_the_file(
    module: ModuleType, blocks: dict[str, Any], key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, **blocks)
    argv = ["--recipe", str(recipe)] if module is swebench_build else [str(tmp_path / "run"), "--recipe", str(recipe)]
    message = refusal(module, argv, capsys)
    assert f"error: recipe {recipe}: {key}: python -m {module.__name__} has no such setting (known: " in message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("blocks", "says"),
    [
        ({"tasks": {"generator": "recipes.gui.tasks"}},
         "tasks.generator is 'recipes.gui.tasks', but for python -m recipes.claw.setup it can only be "
         "'recipes.claw.tasks'"),
        ({"tasks": {"train_per_kind": "many"}}, "tasks.train_per_kind: 'many' is not an integer"),
        ({"tasks": {"train_per_kind": True}}, "tasks.train_per_kind: True is not an integer"),
        ({"expert": {"wrong_fraction": [0.5]}}, "expert.wrong_fraction: [0.5] is not a number"),
        ({"expert": "wrong"}, "expert must be a mapping of settings, not 'wrong'"),
        ({"tasks": {"train_per_kind": "{run_dir}/8"}}, "tasks.train_per_kind: {run_dir} is not filled in here"),
    ],
)  # fmt: skip
def test_a_recorded_key_naming_another_module_and_a_value_of_the_wrong_type_are_refused(
    blocks: dict[str, Any], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, **blocks)
    assert f"error: recipe {recipe}: {says}" in refusal(claw_setup, [str(tmp_path), "--recipe", str(recipe)], capsys)


def test_an_overlay_and_a_set_reach_the_setup_stage_through_the_runs_copy_of_the_recipe(tmp_path: Path) -> None:
    overlay = tmp_path / "small.yaml"
    overlay.write_text("tasks: {train_per_kind: 1, eval_per_kind: 1}\n")
    recipe = load_run_config(CLAW, [overlay], ["expert.wrong_fraction=1.0"])
    given = claw_setup.setup_arguments(setup_in_run(recipe, "setup", tmp_path / "run"))
    assert given == {
        "run_dir": (tmp_path / "run").resolve(),
        "config": ClawConfig(seed=0, train_per_kind=1, eval_per_kind=1, max_steps=12),  # the rest: the recipe's
        "episodes_per_task": 1,
        "wrong_fraction": 1.0,
        "expert_seed": 0,
    }


def test_the_gui_families_are_a_list_or_a_name_and_the_swe_plans_follow_the_recipes_harness(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = write_recipe(tmp_path / "a", tasks={"families": ["docs_error", "booking_cancel"]})
    named = write_recipe(tmp_path / "b", tasks={"families": "cpu"})
    families = [gui_setup.setup_arguments(["run", "--recipe", str(p)])["config"].families for p in (listed, named)]
    assert families == [("booking_cancel", "docs_error"), gui_setup.CPU_FAMILIES]  # the suite's order
    swe = write_recipe(tmp_path / "c", harness="codex", tasks={"suite": "{recipe_dir}/suite", "max_steps": 9})
    given = swe_setup.setup_arguments(["run", "--recipe", str(swe)])
    assert (given["suite"], given["demos"].harness, given["build_config"].max_steps) == (
        (tmp_path / "c").resolve() / "suite", "codex", 9,
    )  # fmt: skip
    wrong = write_recipe(tmp_path / "d", harness="openclaw")
    message = refusal(swe_setup, ["run", "--recipe", str(wrong)], capsys)
    assert f"recipe {wrong}: harness: 'openclaw' is not one of builtin, mini-swe-agent, codex" in message


def test_swebench_build_reads_its_part_of_the_tasks_block_relative_paths_under_the_recipes_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(swebench_build, "build_swebench", lambda *args, **kwargs: calls.append((*args, kwargs)))
    recipe = write_recipe(
        tmp_path,
        tasks={"builder": "recipes.swe.swebench_build", "repos": "/data/repos", "max_steps": 30,
               "skip_unsupported": True, "train": {"instances": "rows.jsonl", "split": "train", "out": "built"},
               "eval": {"instances": "/data/eval.jsonl", "split": "eval", "out": "held-out"}},
    )  # fmt: skip
    assert swebench_build.main(["--recipe", str(recipe), "--recipe-part", "train"]) == 0
    assert swebench_build.main(["mine.jsonl", "--recipe", str(recipe), "--recipe-part", "eval", "out", "--max-steps",
                                "5", "--overwrite"]) == 0  # fmt: skip
    folder = tmp_path.resolve()
    assert calls == [
        (folder / "rows.jsonl", Path("/data/repos"), folder / "built",
         swebench_build.SwebenchBuildConfig(split="train", max_steps=30, skip_unsupported=True), {"overwrite": False}),
        (Path("mine.jsonl"), Path("/data/repos"), Path("out"),
         swebench_build.SwebenchBuildConfig(split="eval", max_steps=5, skip_unsupported=True), {"overwrite": True}),
    ]  # fmt: skip


def test_swebench_build_without_a_recipe_still_needs_its_rows_repositories_and_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "INSTANCES, --repos, OUT: required" in refusal(swebench_build, ["--max-steps", "5"], capsys)


# ---------------------------------------------------------------------------------------------------- shipped
@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_each_shipped_setup_stage_runs_with_exactly_the_settings_its_command_used_to_spell_out(
    name: str, tmp_path: Path
) -> None:
    path, module, expected = SHIPPED[name]
    recipe = load_run_config(path)
    run_dir = tmp_path / "run"
    assert module.setup_arguments(setup_in_run(recipe, "setup", run_dir)) == {"run_dir": run_dir.resolve(), **expected}


@pytest.mark.parametrize("name", ["claw", "file_lookup", "gui", "swe-local"])
def test_the_setup_commands_name_the_runs_copy_of_the_recipe_and_repeat_none_of_its_settings(name: str) -> None:
    path, module, _ = SHIPPED[name]
    setup = load_run_config(path).components["setup"]
    assert isinstance(setup, CommandComponent)
    assert setup.run == ["python", "-m", module.__name__, "{run_dir}", "--recipe", "{run_dir}/recipe.yaml"]


def test_the_run_writes_the_copy_the_setup_commands_name(tmp_path: Path) -> None:
    recipe = load_run_config(CLAW)
    copy = write_run_copy(recipe, tmp_path)
    argv = module_argv(recipe, "setup", tmp_path)
    assert argv[argv.index("--recipe") + 1] == str(copy.resolve())
    assert yaml.safe_load(copy.read_text())["tasks"] == recipe.tasks
