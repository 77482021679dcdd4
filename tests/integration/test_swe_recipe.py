"""``recipes/swe/local.yaml`` through ``orchard run``, every stage, shrunk to one train and one held-out instance.

The recipe file itself is run, with only its sizes turned down (instances, model calls, trainer steps, rounds,
completion length) and its ports moved to free ones: the expert's two demonstrations of the train instance (one
fixing the bug, one failing to) run through the built-in harness, the recording proxy and the grader; credit SFT
publishes the first policy; the reloading engine serves it to the held-out evaluation; RL with Balanced Adaptive
Rollout, then the dense stage with the rubric process reward and on-policy distillation against the first policy
served from the run's store; the value model; best-of-K reranking; the report. Every stage must complete, and each
leaves its trace on the bus and in the run directory.
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
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, SCORES, TRAJECTORIES
from tests.integration.shrunk_recipes import (
    limit_stages,
    run_records,
    run_to_completion,
    set_flag,
    set_override,
    train_on_pairs,
    with_free_ports,
)
from tests.integration.test_run_pipeline import REPO

pytestmark = [pytest.mark.slow, pytest.mark.harness]
RECIPE = REPO / "recipes" / "swe" / "local.yaml"
SUITE = REPO / "recipes" / "swe" / "suite"
TRAIN, HELD_OUT = "pathutils-002", "slugify-001"  # the smallest repositories of each split
RUN_ID = "swe-local"
PORT = re.compile(r"\b84(?:0[0-2]|1[01]|2[0-2])\b")


def shrink(recipe: dict[str, Any], suite: Path) -> dict[str, Any]:
    """The recipe with its ports moved and its sizes turned down; everything else as shipped."""
    shrunk = with_free_ports(recipe, PORT)
    parts = shrunk["components"]
    # what the setup stage reads (--recipe): the expert's 7 calls fit in 10; the second demonstration fails, so
    # credit SFT has one of each
    shrunk["tasks"].update(suite=str(suite), max_steps=10)
    shrunk["expert"]["failing_fraction"] = 1.0
    parts["engine"]["args"] = ["--default-max-tokens", "48"]
    for name, steps in (("trainer-credit", "2"), ("trainer-rl", "3"), ("trainer-dense", "4")):  # steps so far
        overrides = parts[name]["set"]
        set_override(overrides, "max_steps", steps)
        set_override(overrides, "publish_every", "1")
        if name == "trainer-credit":  # a complete input: it ends once its pass is done, no idle time to shorten
            set_override(overrides, "epochs", "1")
        else:  # the dense stage's samples wait for their scores: a busy machine needs more than a few seconds
            set_override(overrides, "idle_exit_s", "20")
    for name in ("rollout-rl", "rollout-dense"):
        parts[name].update(rounds=1, budget=2, min_rollouts=2, max_rollouts=2, wait_timeout_s=300)
    for name in ("builder-rl", "builder-dense"):
        train_on_pairs(parts[name]["env"])
    parts["value-trainer"]["max_steps"] = 2
    set_flag(parts["value-trainer"]["args"], "--idle-exit", "5")
    set_flag(parts["eval-rerank"]["run"], "--rerank", "2")
    limit_stages(shrunk, demos=2, timeout_s=300)
    return shrunk


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shrunk recipe run to its end; its run directory."""
    root = tmp_path_factory.mktemp("swe-recipe")
    suite = root / "suite"
    for instance in (TRAIN, HELD_OUT):
        shutil.copytree(SUITE / instance, suite / instance)
    recipe = root / "local.yaml"
    recipe.write_text(yaml.safe_dump(shrink(layered_recipe(RECIPE), suite), sort_keys=False))  # templates expanded
    run_dir = root / "run"
    run_to_completion(recipe, run_dir, duration_s=840)
    return run_dir


def records(run_dir: Path, topic: str) -> list[dict[str, Any]]:
    """The run's records on ``topic``."""
    return run_records(run_dir, topic, RUN_ID)


@pytest.mark.timeout(960)
def test_every_stage_of_the_local_swe_recipe_completes_in_order(finished_run: Path) -> None:
    state = json.loads((finished_run / "state.json").read_text())
    expected = yaml.safe_load(RECIPE.read_text())["stages"]
    assert [(s["name"], s["status"]) for s in state["stages"]] == [(s["name"], "completed") for s in expected]


@pytest.mark.timeout(960)
def test_demonstrations_are_graded_episodes_and_one_of_each_kind_is_resolved_or_not(finished_run: Path) -> None:
    outcomes = {o["episode_id"]: o for o in records(finished_run, OUTCOMES)}
    demos = [json.loads(line) for line in (finished_run / "demos" / "demonstrations.jsonl").read_text().splitlines()]
    assert [(d["task_id"], d["kind"]) for d in demos] == [(TRAIN, "fix"), (TRAIN, "no-fix")]
    fixed, unfixed = (outcomes[d["episode_id"]] for d in demos)
    assert (fixed["success"], fixed["signals"]["f2p_fraction"]) == (True, 1.0)
    assert (unfixed["success"], unfixed["signals"]["f2p_fraction"]) == (False, 0.0)
    calls = [c for c in records(finished_run, MODEL_CALLS) if c["episode_id"] == fixed["episode_id"]]
    assert len(calls) == fixed["num_model_calls"] >= 5  # explore, read, test, write, test, submit


@pytest.mark.timeout(960)
def test_each_evaluation_writes_its_row_and_the_rerank_row_chose_among_two_attempts(finished_run: Path) -> None:
    rows = {row["stage"]: row for row in json.loads((finished_run / "results.json").read_text())["stages"]}
    assert set(rows) == {"credit-sft", "rl-bar", "dense", "rerank"}
    assert all(row["tasks"] == 1 and row["missing"] == 0 for row in rows.values())
    assert rows["rerank"]["samples_per_task"] == 2
    eval_outcomes = [o for o in records(finished_run, OUTCOMES) if o["group_id"].startswith("eval-")]
    assert len(eval_outcomes) == 3 + 2 and {o["task_id"] for o in eval_outcomes} == {HELD_OUT}
    assert (finished_run / "reward_curve.png").stat().st_size > 0


@pytest.mark.timeout(960)
def test_training_published_policies_the_dense_stage_scored_calls_and_the_value_model_was_published(
    finished_run: Path,
) -> None:
    versions = records(finished_run, POLICY_VERSIONS)
    policy = sorted(v["version"] for v in versions if v["model"] == "policy")
    # credit SFT's, then RL's and dense RL's (one version per step: how many steps RL took before the dense stage
    # resumed from it depends on when its samples arrived, so the dense stage publishes one or two)
    assert policy[:2] == [1, 2] and policy == list(range(1, len(policy) + 1)) and len(policy) in (3, 4)
    assert any(v["model"] == "value" for v in versions)
    scorers = {s["scorer"] for s in records(finished_run, SCORES)}
    assert {"rule_process_reward", "distillation"} <= scorers
    teacher = [json.loads(line) for line in (finished_run / "logs" / "teacher.log").read_text().splitlines()
               if line.startswith("{") and '"policy version loaded"' in line]  # fmt: skip
    assert [entry["version"] for entry in teacher] == [1]  # the distillation teacher served the credit-SFT policy
    trajectories = records(finished_run, TRAJECTORIES)
    assert len({t["episode_id"] for t in trajectories}) == 2 + 2 + 2 + 5  # demos, RL, dense, evaluations
