"""``recipes/claw/recipe.yaml`` through ``orchard run``, every stage, shrunk to two train tasks and one held-out task.

The recipe file itself is run, with only its sizes turned down (trainer steps, rounds, completion length, stage
timeouts) and its ports moved to free ones. Its setup stage finds the run's tasks already generated with its own
options and trimmed to three (the idempotent path: kept, plans rewritten), so the expert's two demonstrations (one
task's reference solution, another's wrong one) run through the ``claw`` harness with the services inside the sandbox,
the recording proxy and the state grader; credit SFT publishes the first policy; the reloading engine serves it to
the held-out evaluation (by task kind); RL with Balanced Adaptive Rollout publishes the next; its evaluation; the
report. Every stage must complete, and each leaves its trace on the bus and in the run directory.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.run.recipe_layers import layered_recipe
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, TRAJECTORIES
from recipes.claw.tasks import SOLUTIONS_DIR, ClawConfig, generate
from tests.integration.shrunk_recipes import (
    limit_stages,
    run_records,
    run_to_completion,
    set_override,
    train_on_pairs,
    with_free_ports,
)
from tests.integration.test_run_pipeline import REPO

pytestmark = [pytest.mark.slow, pytest.mark.harness]
RECIPE = REPO / "recipes" / "claw" / "recipe.yaml"
# the recipe's own wrong-fraction (0.25) and expert seed (0) demonstrate the first one's reference and the second
# one's wrong solution (3 tool calls each); the held-out task is as short
REFERENCE_TASK, WRONG_TASK = "claw-train-contact-000", "claw-train-contact-003"
HELD_OUT = "claw-eval-contact-000"
RUN_ID = "claw"
PORT = re.compile(r"\b85(?:0[0-2]|1[01]|2[0-2])\b")


def shrink(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe with its ports moved and its sizes turned down; everything else as shipped."""
    shrunk = with_free_ports(recipe, PORT)
    parts = shrunk["components"]
    parts["engine"]["args"] = ["--default-max-tokens", "16"]  # the barely trained policy's calls end quickly
    for name, steps in (("trainer-credit", "1"), ("trainer-rl", "2")):  # steps so far: one each
        overrides = parts[name]["set"]
        set_override(overrides, "max_steps", steps)
        set_override(overrides, "idle_exit_s", "5")
        set_override(overrides, "publish_every", "1")
        if name == "trainer-credit":
            set_override(overrides, "epochs", "1")
    parts["rollout-rl"].update(rounds=1, budget=2, min_rollouts=2, max_rollouts=2, wait_timeout_s=120)
    train_on_pairs(parts["builder-rl"]["env"])
    limit_stages(shrunk, demos=2, timeout_s=120)
    return shrunk


def pregenerate(run_dir: Path, tasks_block: dict[str, Any]) -> None:
    """The tasks the recipe's setup command would generate (its ``tasks:`` block), trimmed to this test's three."""
    config = ClawConfig(**{name: value for name, value in tasks_block.items() if name in ClawConfig.model_fields})
    tasks = run_dir / "tasks"
    generate(config, tasks)
    keep = {"train": {REFERENCE_TASK, WRONG_TASK}, "eval": {HELD_OUT}}
    for split, kept in keep.items():
        for task in (tasks / split).iterdir():
            if task.name not in kept:
                shutil.rmtree(task)
                (tasks / SOLUTIONS_DIR / split / f"{task.name}.json").unlink()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shrunk recipe run to its end; its run directory."""
    root = tmp_path_factory.mktemp("claw-recipe")
    shipped = layered_recipe(RECIPE)  # templates expanded: every component spelled out
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(shrink(shipped), sort_keys=False))
    run_dir = root / "run"
    pregenerate(run_dir, shipped["tasks"])
    run_to_completion(recipe, run_dir, duration_s=600)
    return run_dir


def records(run_dir: Path, topic: str) -> list[dict[str, Any]]:
    """The run's records on ``topic``."""
    return run_records(run_dir, topic, RUN_ID)


@pytest.mark.timeout(720)
def test_every_stage_of_the_claw_recipe_completes_in_order(finished_run: Path) -> None:
    state = json.loads((finished_run / "state.json").read_text())
    expected = yaml.safe_load(RECIPE.read_text())["stages"]
    assert [(s["name"], s["status"]) for s in state["stages"]] == [(s["name"], "completed") for s in expected]


@pytest.mark.timeout(720)
def test_demonstrations_are_graded_claw_episodes_the_reference_succeeds_and_the_wrong_one_fails(
    finished_run: Path,
) -> None:
    demos = [json.loads(line) for line in (finished_run / "demos" / "demonstrations.jsonl").read_text().splitlines()]
    assert [(d["task_id"], d["solution"]) for d in demos] == [(REFERENCE_TASK, "reference"), (WRONG_TASK, "wrong")]
    outcomes = {o["episode_id"]: o for o in records(finished_run, OUTCOMES)}
    reference, wrong = (outcomes[d["episode_id"]] for d in demos)
    assert (reference["success"], reference["signals"]["progress"]) == (True, 1.0)
    assert wrong["success"] is False and 0.0 < wrong["signals"]["progress"] < 1.0  # partial progress
    calls = [c for c in records(finished_run, MODEL_CALLS) if c["episode_id"] == reference["episode_id"]]
    assert len(calls) == reference["num_model_calls"] == 4  # three service tool calls, then submit
    assert {c["harness"] for c in calls} == {"claw"}


@pytest.mark.timeout(720)
def test_each_evaluation_writes_its_row_broken_down_by_task_kind(finished_run: Path) -> None:
    rows = {row["stage"]: row for row in json.loads((finished_run / "results.json").read_text())["stages"]}
    assert set(rows) == {"credit-sft", "rl-bar"}
    assert all(row["tasks"] == 1 and row["missing"] == 0 for row in rows.values())
    for stage in rows:  # broken down by the tasks' `kind` label
        [group] = json.loads((finished_run / "eval" / f"{stage}.json").read_text())["breakdown"]["kind"]
        assert (group["value"], group["tasks"]) == ("contact", 1)
    eval_outcomes = [o for o in records(finished_run, OUTCOMES) if o["group_id"].startswith("eval-")]
    assert len(eval_outcomes) == 2 and {o["task_id"] for o in eval_outcomes} == {HELD_OUT}
    assert (finished_run / "reward_curve.png").stat().st_size > 0


@pytest.mark.timeout(720)
def test_credit_sft_and_rl_published_policies_and_every_episode_left_a_trajectory(finished_run: Path) -> None:
    policy = {v["version"] for v in records(finished_run, POLICY_VERSIONS) if v["model"] == "policy"}
    assert policy == {1, 2}  # credit SFT's, then RL's
    trajectories = records(finished_run, TRAJECTORIES)
    assert len({t["episode_id"] for t in trajectories}) == 2 + 2 + 2  # demos, RL, evaluations
