"""``recipes/gui/recipe.yaml`` through ``orchard run``, every stage, shrunk to one train and one held-out task of two
families (a booking cancellation graded on the app's state, a docs question graded on the answer).

The recipe file itself is run, with only its sizes turned down (tasks, model calls, trainer steps, rounds,
completion length) and its ports moved to free ones: the expert's demonstrations (one replaying the reference, one
imperfect, per task) run in real headless Chromium through the browser harness in text mode, the recording proxy
and the grader; credit SFT publishes the first policy; the reloading engine serves it to the held-out evaluation;
RL with Balanced Adaptive Rollout publishes the second; the report. Every stage must complete.
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
from tests.integration.shrunk_recipes import (
    limit_stages,
    run_records,
    run_to_completion,
    set_override,
    train_on_pairs,
    with_free_ports,
)
from tests.integration.test_run_pipeline import REPO

pytestmark = [pytest.mark.slow, pytest.mark.harness, pytest.mark.browser]
RECIPE = REPO / "recipes" / "gui" / "recipe.yaml"
FAMILIES = ["booking_cancel", "docs_release"]
RUN_ID = "gui-local"
PORT = re.compile(r"\b86(?:0[0-2]|1[01]|2[0-2])\b")


def shrink(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe with its ports moved and its sizes turned down; everything else as shipped."""
    shrunk = with_free_ports(recipe, PORT)
    parts = shrunk["components"]
    # what the setup stage reads (--recipe): 4 model calls fit the expert's 3 or 4; the second demonstration is
    # imperfect, one of each per task
    shrunk["tasks"].update(families=FAMILIES, train_per_family=1, eval_per_family=1, max_steps=4)
    shrunk["expert"]["failing_fraction"] = 1.0
    parts["engine"]["args"] = ["--default-max-tokens", "32"]
    for name, steps in (("trainer-credit", "1"), ("trainer-rl", "2")):  # steps so far: one each
        overrides = parts[name]["set"]
        set_override(overrides, "max_steps", steps)
        set_override(overrides, "batch_tokens", "4096")
        set_override(overrides, "idle_exit_s", "5")
        set_override(overrides, "publish_every", "1")
        if name == "trainer-credit":
            set_override(overrides, "epochs", "1")
    parts["rollout-rl"].update(rounds=1, budget=2, min_rollouts=2, max_rollouts=2, wait_timeout_s=300)
    train_on_pairs(parts["builder-rl"]["env"])
    limit_stages(shrunk, demos=4, timeout_s=300)
    return shrunk


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shrunk recipe run to its end; its run directory."""
    if shutil.which("chromium") is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright", reason="Playwright is not installed (pip install playwright)")
    root = tmp_path_factory.mktemp("gui-recipe")
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(shrink(layered_recipe(RECIPE)), sort_keys=False))  # templates expanded
    run_dir = root / "run"
    run_to_completion(recipe, run_dir, duration_s=600)
    return run_dir


def records(run_dir: Path, topic: str) -> list[dict[str, Any]]:
    """The run's records on ``topic``."""
    return run_records(run_dir, topic, RUN_ID)


@pytest.mark.timeout(720)
def test_every_stage_of_the_gui_recipe_completes_in_order(finished_run: Path) -> None:
    state = json.loads((finished_run / "state.json").read_text())
    expected = yaml.safe_load(RECIPE.read_text())["stages"]
    assert [(s["name"], s["status"]) for s in state["stages"]] == [(s["name"], "completed") for s in expected]


@pytest.mark.timeout(720)
def test_demonstrations_ran_in_the_browser_in_text_mode_and_were_graded_on_state_and_answer(finished_run: Path) -> None:
    outcomes = {o["episode_id"]: o for o in records(finished_run, OUTCOMES)}
    demos = [json.loads(line) for line in (finished_run / "demos" / "demonstrations.jsonl").read_text().splitlines()]
    assert [d["kind"] for d in demos] == ["reference", "wrong_target", "reference", "wrong_answer"]
    graded = [(outcomes[d["episode_id"]]["success"], outcomes[d["episode_id"]]["signals"]["progress"]) for d in demos]
    assert graded == [(True, 1.0), (False, 0.0), (True, 1.0), (False, pytest.approx(0.2))]
    cancelled = outcomes[demos[0]["episode_id"]]["signals"]
    assert (cancelled["cancelled"], cancelled["kept"]) == (1.0, 1.0)  # the app's state, not the agent's text
    calls = [c for c in records(finished_run, MODEL_CALLS) if c["episode_id"] == demos[2]["episode_id"]]
    assert len(calls) == outcomes[demos[2]["episode_id"]]["num_model_calls"] == 4  # navigate, type, click, answer
    assert {c["harness"] for c in calls} == {"browser"}
    first = json.loads(calls[0]["request_messages_json"])
    assert "Page: " in first[-1]["content"] and "[1] link" in first[-1]["content"]  # the text view, no image parts
    assert all("image_url" not in c["request_messages_json"] for c in calls)


@pytest.mark.timeout(720)
def test_each_evaluation_writes_its_row_over_both_held_out_tasks(finished_run: Path) -> None:
    rows = {row["stage"]: row for row in json.loads((finished_run / "results.json").read_text())["stages"]}
    assert set(rows) == {"credit-sft", "rl-bar"}
    assert all(row["tasks"] == 2 and row["missing"] == 0 for row in rows.values())
    eval_outcomes = [o for o in records(finished_run, OUTCOMES) if o["group_id"].startswith("eval-")]
    assert len(eval_outcomes) == 4 and all(o["status"] != "CRASHED" for o in eval_outcomes)
    assert (finished_run / "reward_curve.png").stat().st_size > 0


@pytest.mark.timeout(720)
def test_credit_sft_and_rl_published_policies_trained_on_browser_trajectories(finished_run: Path) -> None:
    policy = sorted(v["version"] for v in records(finished_run, POLICY_VERSIONS) if v["model"] == "policy")
    assert policy == [1, 2]  # credit SFT's, RL's
    trajectories = records(finished_run, TRAJECTORIES)
    assert len({t["episode_id"] for t in trajectories}) == 4 + 2 + 4  # demos, RL, evaluations
