"""``recipes/file_lookup/recipe.yaml``'s RL stage in lockstep, through ``orchard run``, shrunk to 16 train tasks.

The recipe file itself is run up to (c): setup, the expert's demonstrations, (a) SFT, then two lockstep BAR rounds
(groups of 4, a new task per group) with the real rollout command, Env, recording proxy, reloading engine, assembler,
sample builder and trainer on ``input: rounds``. Lockstep means: every model call of round 0 is served by (a)'s
version, every call of round 1 by the version trained on round 0, and each round gets exactly one version tagged
with it; every RL call asks with a seed of its own.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.run.recipe_layers import layered_recipe
from orchard.topics import MODEL_CALLS, OUTCOMES, POLICY_VERSIONS, ROLLOUT_ROUNDS
from tests.integration.shrunk_recipes import limit_stages, run_records, run_to_completion, set_override, with_free_ports
from tests.integration.test_run_pipeline import REPO

pytestmark = [pytest.mark.slow, pytest.mark.harness]
RECIPE = REPO / "recipes" / "file_lookup" / "recipe.yaml"
RUN_ID = "file-lookup"
PORT = re.compile(r"\b8(?:000|1\d\d|2\d\d|300)\b")
KEPT = ["setup", "expert", "proxy", "env", "demos", "assembler", "builder-sft", "step-reward-demos", "trainer",
        "engine", "policy-proxy", "rl-env", "rollout-rl", "builder-rl", "trainer-rl"]  # fmt: skip


def shrink(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe up to (c), its ports moved and its sizes turned down; everything else as shipped."""
    recipe["components"] = {name: recipe["components"][name] for name in KEPT}
    recipe["stages"] = [stage for stage in recipe["stages"] if stage["name"] in ("setup", "demos", "sft-successful",
                                                                                    "rl-bar")]  # fmt: skip
    recipe["tasks"].update(train_tasks=16, eval_tasks=4)
    shrunk = with_free_ports(recipe, PORT)
    parts = shrunk["components"]
    parts["engine"]["args"] = ["--default-max-tokens", "48"]  # the barely trained policy's calls end quickly
    set_override(parts["trainer"]["set"], "max_steps", "6")
    parts["rollout-rl"].update(rounds=2, budget=8, min_rollouts=4, max_rollouts=4, max_task_outcomes=4,
                               wait_timeout_s=240)  # fmt: skip
    builder = parts["builder-rl"]["env"]
    builder["ORCHARD_CONSUMERS__SAMPLE_BUILDER__GROUP_SIZE"] = "4"
    builder["ORCHARD_CONSUMERS__SAMPLE_BUILDER__EMIT_ZERO_SAMPLES"] = "true"  # uniform groups train too: steps
    limit_stages(shrunk, demos=16, timeout_s=300)
    return shrunk


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shrunk recipe run to its end; its run directory."""
    root = tmp_path_factory.mktemp("file-lookup-lockstep")
    recipe = root / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(shrink(layered_recipe(RECIPE)), sort_keys=False))
    run_dir = root / "run"
    run_to_completion(recipe, run_dir, duration_s=900)
    return run_dir


@pytest.mark.timeout(1000)
def test_each_lockstep_round_is_served_by_the_version_trained_on_the_round_before(finished_run: Path) -> None:
    versions = [v for v in run_records(finished_run, POLICY_VERSIONS, RUN_ID) if v["model"] == "policy"]
    assert [(v["version"], v["metrics"].get("rollout_round")) for v in versions] == [(1, None), (2, 0.0), (3, 1.0)]
    rounds = run_records(finished_run, ROLLOUT_ROUNDS, RUN_ID)  # each planned, then announced complete
    assert [(r["round"], r["complete"], r["episodes"], len(r["group_ids"])) for r in rounds] == [
        (0, False, 8, 2), (0, True, 8, 2), (1, False, 8, 2), (1, True, 8, 2)
    ]  # fmt: skip
    assert [r["policy_version"] for r in rounds if r["complete"]] == [1, 2]
    assert [len(r["samples_end_offsets"]) for r in rounds] == [0, 4, 0, 4]  # the samples topic's 4 partitions

    rl_episodes = {o["episode_id"]: int(o["group_id"][1:7]) for o in run_records(finished_run, OUTCOMES, RUN_ID)
                   if re.match(r"^r\d{6}-", o["group_id"])}  # fmt: skip
    assert sorted(rl_episodes.values()) == [0] * 8 + [1] * 8
    served: dict[int, set[int]] = defaultdict(set)
    seeds: list[int] = []
    for call in run_records(finished_run, MODEL_CALLS, RUN_ID):
        if call["episode_id"] in rl_episodes:
            served[rl_episodes[call["episode_id"]]].add(call["policy_version"])
            seeds.append(json.loads(call["sampling_params_json"]).get("seed"))
    assert dict(served) == {0: {1}, 1: {2}}
    assert None not in seeds and len(set(seeds)) == len(seeds)  # every call its own seed
