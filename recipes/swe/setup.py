"""The setup stage of the SWE recipe: the suite built into task splits, and the expert's demonstration plans.

``python -m recipes.swe.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [--suite recipes/swe/suite] [--harness builtin]
[--episodes-per-task 2] [--failing-fraction 0.3] [--seed 0] [--max-steps 16] [--harness-timeout-s 900]
[--grade-timeout-s 300] [--python PATH]`` writes

- ``RUN_DIR/tasks/{train,eval}/<instance_id>/`` and ``RUN_DIR/tasks/manifest.json`` (``recipes.swe.build``);
- ``RUN_DIR/demos/plans/<episode_id>.yaml``: the scripted expert's plan of every demonstration episode, in the
  harness's dialect (``recipes.swe.expert``), and ``RUN_DIR/demos/demonstrations.jsonl`` (episode id, task id, kind),
  which ``orchard rollout run --demos`` submits and ``orchard engine expert`` serves.

Every train instance gets ``episodes_per_task`` demonstrations. The first always applies the reference fix; each
further one is, with probability ``failing_fraction`` (seeded by instance and index, so the same options give the
same plans), an imperfect one that explores and runs the tests without fixing anything: a teacher's failed
attempt, which credit-assignment SFT weighs by its progress signal instead of dropping or copying it.

With ``--recipe`` the options' defaults are the recipe's ``tasks:`` (``suite``, ``max_steps``, ``harness_timeout_s``,
``grade_timeout_s``, ``python``) and ``expert:`` blocks (``episodes_per_task``, ``failing_fraction``, ``seed``) and its
``harness`` (the plans' dialect), ``recipes.recipe_settings``: the recipe's setup component passes ``--recipe
{run_dir}/recipe.yaml`` and repeats none of them. A relative ``suite`` is relative to the recipe file.

It is idempotent, so a restarted or resumed stage does not fail on its own output: tasks already built with the
same options are kept (other options: an error naming the manifest), and the plans are rewritten.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchard.logging import get_logger
from recipes.recipe_settings import Block, add_recipe_option, parse_with_recipe
from recipes.swe.build import BuildConfig, build
from recipes.swe.expert import DIALECTS, Dialect, expert_episode_id, expert_plan
from recipes.swe.instance import load_suite_instance, suite_instances

log = get_logger("recipes.swe.setup")
PROG = "python -m recipes.swe.setup"
SUITE = Path(__file__).resolve().parent / "suite"
TASKS_DIR = "tasks"
DEMOS_DIR = "demos"
DemoKind = Literal["fix", "no-fix"]
RECIPE_BLOCKS = {
    "tasks": Block(
        options={name: name for name in ("suite", "max_steps", "harness_timeout_s", "grade_timeout_s", "python")}
    ),
    "expert": Block(
        options={"episodes_per_task": "episodes_per_task", "failing_fraction": "failing_fraction", "seed": "seed"},
        recorded={"module": "recipes.swe.expert"},
    ),
}
"""What ``--recipe`` reads: block key -> option (``recipes.recipe_settings``); the recipe's ``harness`` too."""


class DemoConfig(BaseModel):
    """Which demonstrations the expert plans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: Dialect = Field("builtin", description="Harness whose dialect the plans speak.")
    episodes_per_task: int = Field(2, ge=1, le=16, description="Demonstrations per train instance.")
    failing_fraction: float = Field(0.3, ge=0.0, le=1.0, description="Chance a later demonstration fails.")
    seed: int = Field(0, description="Seed of the choice of failing demonstrations.")
    python: str = Field("python3", min_length=1, description="Interpreter the expert runs the tests with.")


def demo_kind(instance_id: str, index: int, config: DemoConfig) -> DemoKind:
    """Whether demonstration ``index`` of an instance applies the fix (index 0 always does)."""
    if index == 0:
        return "fix"
    digest = hashlib.sha256(f"{config.seed}\0{instance_id}\0{index}".encode()).digest()
    return "no-fix" if int.from_bytes(digest[:8], "big") / 2**64 < config.failing_fraction else "fix"


def write_demonstrations(suite: Path, out: Path, config: DemoConfig) -> list[dict[str, str]]:
    """Plan every train instance's demonstrations under ``out``; returns the lines of ``demonstrations.jsonl``."""
    plans = out / "plans"
    if plans.exists():
        shutil.rmtree(plans)  # plans of other options must not linger (the backend serves every file there)
    plans.mkdir(parents=True)
    lines: list[dict[str, str]] = []
    for instance_dir in suite_instances(suite):
        instance = load_suite_instance(instance_dir)
        if instance.split != "train":
            continue
        for index in range(config.episodes_per_task):
            kind = demo_kind(instance.instance_id, index, config)
            episode_id = expert_episode_id(instance.instance_id, config.harness, index)
            plan = expert_plan(instance_dir, config.harness, python=config.python, apply_fix=kind == "fix")
            (plans / f"{episode_id}.yaml").write_text(yaml.safe_dump(plan.model_dump(mode="json")))
            lines.append({"episode_id": episode_id, "task_id": instance.instance_id, "kind": kind})
    (out / "demonstrations.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    kinds = {kind: sum(line["kind"] == kind for line in lines) for kind in ("fix", "no-fix")}
    log.info("swe expert plans written", out=str(out), episodes=len(lines), harness=config.harness, **kinds)
    return lines


def setup(run_dir: Path, suite: Path, build_config: BuildConfig, demos: DemoConfig) -> tuple[Path, Path]:
    """Build the tasks and plan the demonstrations under ``run_dir``; returns (tasks dir, demos dir)."""
    tasks, demos_dir = run_dir / TASKS_DIR, run_dir / DEMOS_DIR
    if not suite_instances(suite):
        raise ValueError(f"--suite {suite}: no instance directories (holding instance.yaml) there")
    manifest = tasks / "manifest.json"
    if manifest.is_file():
        written = json.loads(manifest.read_text())["config"]
        if written != build_config.model_dump():
            raise ValueError(f"{manifest} was built with other options ({written}); use another run directory")
        log.info("swe tasks already built, kept", tasks=str(tasks))
    else:
        build(suite, tasks, build_config, overwrite=True)  # a crash before the manifest leaves a partial tree
    write_demonstrations(suite, demos_dir, demos)
    return tasks, demos_dir


def setup_arguments(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``setup`` that the command line ``argv`` asks for."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="The run directory (tasks/ and demos/ are written in it).")
    add_recipe_option(parser, "tasks: and expert: blocks and harness")
    parser.add_argument("--suite", type=Path, default=SUITE, help="The suite directory (default: the shipped one).")
    parser.add_argument("--harness", choices=DIALECTS, default="builtin", help="The harness the plans are for.")
    parser.add_argument("--episodes-per-task", type=int, default=2, help="Demonstrations per train instance.")
    parser.add_argument("--failing-fraction", type=float, default=0.3, help="Chance a later demonstration fails.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the choice of failing demonstrations.")
    parser.add_argument("--max-steps", type=int, default=16, help="Model calls per episode.")
    parser.add_argument("--harness-timeout-s", type=float, default=900.0, help="Wall-clock limit of the harness.")
    parser.add_argument("--grade-timeout-s", type=float, default=300.0, help="Wall-clock limit of the grader.")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="Interpreter with pytest inside the sandbox, for the grader and the expert's test runs (default: this "
        "one, which the local runtime shares with its sandboxes; python3 for images that have pytest).",
    )
    args = parse_with_recipe(parser, argv, RECIPE_BLOCKS, top={"harness": "harness"})
    build_config = BuildConfig(
        max_steps=args.max_steps,
        harness_timeout_s=args.harness_timeout_s,
        grade_timeout_s=args.grade_timeout_s,
        python=args.python,
    )
    demos = DemoConfig(
        harness=args.harness,
        episodes_per_task=args.episodes_per_task,
        failing_fraction=args.failing_fraction,
        seed=args.seed,
        python=args.python,
    )
    return {"run_dir": args.run_dir, "suite": args.suite, "build_config": build_config, "demos": demos}


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.swe.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [options]``."""
    setup(**setup_arguments(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
