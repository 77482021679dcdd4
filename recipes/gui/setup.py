"""The setup stage of the GUI recipe: the task splits and the expert's demonstration plans, in one command.

``python -m recipes.gui.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [--families all|cpu|F1,F2,...] [--seed 0]
[--train-per-family 5] [--eval-per-family 2] [--max-steps 20] [--harness-timeout-s 300] [--grade-timeout-s 30]
[--episodes-per-task 2] [--failing-fraction 0.3] [--expert-seed 0]`` writes

- ``RUN_DIR/tasks/{train,eval}/<task_id>/`` and ``RUN_DIR/tasks/manifest.json``: the suite of ``recipes.gui.tasks``
  (every family by default, or the ``--families`` named), task directories exactly as the generator writes them;
- ``RUN_DIR/references/<task_id>.json``: the reference solutions, outside the task directories (the recipe hides
  this folder from sandboxes, like ``RUN_DIR/demos``);
- ``RUN_DIR/demos/plans/<episode_id>.yaml``: the scripted expert's plan of every demonstration (a ``ScriptedPlan``
  for the ``browser`` harness: one tool call per model turn, elements named by their exact accessible names), and
  ``RUN_DIR/demos/demonstrations.jsonl`` (episode id, task id, kind, answer), which ``orchard rollout run --demos``
  submits and ``orchard engine expert`` serves.

Every train task gets ``episodes_per_task`` demonstrations. The first replays the reference (``reference``); each
further one is, with probability ``failing_fraction`` (seeded by task and index, so the same options give the same
plans), an imperfect one with a known grade: ``wrong_answer`` (the reference's browsing, then the task's wrong
answer: answer tasks, progress 0.2), ``wrong_target`` (cancels the booking the user keeps: ``booking_cancel``,
progress 0), or ``quit`` (the reference's browsing up to its decisive action, then a reply without a tool call, which
ends the episode unfinished). Otherwise it replays the reference too.

With ``--recipe`` the options' defaults are the recipe's ``tasks:`` (``families``, a list or ``all``/``cpu``, and
every ``SuiteConfig`` field by name) and ``expert:`` blocks (``episodes_per_task``, ``failing_fraction``, ``seed``),
``recipes.recipe_settings``: the recipe's setup component passes ``--recipe {run_dir}/recipe.yaml`` and repeats none
of them.

It is idempotent, so a restarted or resumed stage does not fail on its own output: tasks already generated with the
same options are kept (other options: an error naming the manifest), and the plans are rewritten.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.episode_groups import demo_episode_id
from orchard.logging import get_logger
from recipes.gui.tasks import FAMILIES, GuiTask, SuiteConfig, make_task, reference_record, write_task
from recipes.model_options import add_model_options, model_from_options
from recipes.recipe_settings import Block, add_recipe_option, parse_with_recipe

log = get_logger("recipes.gui.setup")
PROG = "python -m recipes.gui.setup"
TASKS_DIR = "tasks"
REFERENCES_DIR = "references"
DEMOS_DIR = "demos"
EXPERT_MODEL = "gui-expert"
CPU_FAMILIES = ("booking_cancel", "docs_setting", "docs_error", "docs_release")
"""The families whose whole expert episode fits the 8192-token context of ``tiny-llama-8k`` in text mode (measured
with its tokenizer: 2.0k-2.8k tokens; the shop's listing pages alone are ~7k, a booking-form episode 9.5k-12.6k)."""
DemoKind = Literal["reference", "wrong_answer", "wrong_target", "quit"]
RECIPE_BLOCKS = {
    "tasks": Block(
        options={"families": "families"} | {name: name for name in SuiteConfig.model_fields},
        recorded={"generator": "recipes.gui.tasks"},
    ),
    "expert": Block(
        options={
            "episodes_per_task": "episodes_per_task",
            "failing_fraction": "failing_fraction",
            "seed": "expert_seed",
        },
        recorded={"module": "recipes.gui.setup"},
    ),
}
"""What ``--recipe`` reads: block key -> option (``recipes.recipe_settings``)."""


class GuiSetupConfig(BaseModel):
    """Which tasks the setup stage writes: the suite's options and the families kept."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: SuiteConfig = Field(default_factory=SuiteConfig, description="The generator's options.")
    families: tuple[str, ...] = Field(tuple(FAMILIES), min_length=1, description="Families written, in suite order.")

    @field_validator("families")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
        return tuple(family for family in FAMILIES if family in value)


class DemoConfig(BaseModel):
    """Which demonstrations the expert plans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    episodes_per_task: int = Field(2, ge=1, le=16, description="Demonstrations per train task.")
    failing_fraction: float = Field(0.3, ge=0.0, le=1.0, description="Chance a later demonstration is imperfect.")
    seed: int = Field(0, description="Seed of the choice of imperfect demonstrations.")
    model: str = Field(EXPERT_MODEL, min_length=1, description="Model id of the plans.")


def demo_kind(task: GuiTask, index: int, config: DemoConfig) -> DemoKind:
    """What demonstration ``index`` of ``task`` does (index 0 always replays the reference)."""
    if index == 0:
        return "reference"
    digest = hashlib.sha256(f"{config.seed}\0{task.task_id}\0{index}".encode()).digest()
    if int.from_bytes(digest[:8], "big") / 2**64 >= config.failing_fraction:
        return "reference"
    if task.wrong_answer is not None:
        return "wrong_answer"
    if task.family == "booking_cancel":
        return "wrong_target"
    return "quit"


def demo_actions(task: GuiTask, kind: DemoKind) -> tuple[list[dict[str, Any]], str | None]:
    """The browser actions of a demonstration of ``kind``, and the answer it submits (None: it never answers)."""
    actions = [dict(action) for action in task.actions]
    if kind == "reference":
        return actions, task.answer
    if kind == "wrong_answer":
        if task.wrong_answer is None:
            raise ValueError(f"{task.task_id}: no wrong answer for a wrong_answer demonstration")
        actions[-1] = {"tool": "answer", "arguments": {"text": task.wrong_answer}}
        return actions, task.wrong_answer
    if kind == "wrong_target":
        [(method, path, form)] = task.wrong_http
        if (method, path) != ("POST", "/booking/cancel"):
            raise ValueError(f"{task.task_id}: wrong_target needs a wrong cancellation, got {method} {path}")
        actions[-2] = {"tool": "click", "arguments": {"element": f"Cancel booking {form['code']}"}}
        return actions, task.answer
    return actions[: max(1, len(actions) - 2)], None  # browse, then stop before the decisive action


def demo_plan(task: GuiTask, kind: DemoKind, model: str = EXPERT_MODEL) -> ScriptedPlan:
    """The scripted plan of a demonstration: one browser tool call per model turn (a final reply when ``quit``)."""
    actions, _ = demo_actions(task, kind)
    steps = [ScriptedStep(tool_calls=[ScriptedToolCall(name=a["tool"], arguments=a["arguments"])]) for a in actions]
    if kind == "quit":
        steps.append(ScriptedStep(text="I could not finish the task."))
    return ScriptedPlan(steps=steps, final_text="done", model=model)


def suite_tasks(config: GuiSetupConfig) -> list[GuiTask]:
    """The chosen families' tasks, in the generator's order (``recipes.gui.tasks.generate_tasks``, filtered)."""
    counts = {"train": config.suite.train_per_family, "eval": config.suite.eval_per_family}
    return [
        make_task(family, split, index, config.suite.seed)
        for split, count in counts.items()
        for family in config.families
        for index in range(count)
    ]


def write_tasks(out: Path, config: GuiSetupConfig) -> list[GuiTask]:
    """``out/{train,eval}``, ``out/manifest.json`` and the references beside ``out`` (``../references``)."""
    if out.exists():
        shutil.rmtree(out)  # a crash before the manifest leaves a partial tree: start over
    references = out.parent / REFERENCES_DIR
    if references.exists():
        shutil.rmtree(references)
    references.mkdir(parents=True)
    tasks = suite_tasks(config)
    for task in tasks:
        write_task(task, config.suite, out / task.split / task.task_id)
        (references / f"{task.task_id}.json").write_text(json.dumps(reference_record(task), indent=1) + "\n")
    splits = {split: [t.task_id for t in tasks if t.split == split] for split in ("train", "eval")}
    manifest = {"recipe": "gui", "config": config.model_dump(mode="json"), "splits": splits}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("gui tasks written", out=str(out), train=len(splits["train"]), eval=len(splits["eval"]))
    return tasks


def write_demonstrations(tasks: Sequence[GuiTask], out: Path, config: DemoConfig) -> list[dict[str, Any]]:
    """Plan every train task's demonstrations under ``out``; returns the lines of ``demonstrations.jsonl``."""
    plans = out / "plans"
    if plans.exists():
        shutil.rmtree(plans)  # plans of other options must not linger (the backend serves every file there)
    plans.mkdir(parents=True)
    lines: list[dict[str, Any]] = []
    for task in tasks:
        if task.split != "train":
            continue
        for index in range(config.episodes_per_task):
            kind, episode_id = demo_kind(task, index, config), demo_episode_id(task.task_id, index)
            plan = demo_plan(task, kind, config.model)
            plan_data = plan.model_dump(mode="json", exclude_defaults=True)
            (plans / f"{episode_id}.yaml").write_text(yaml.safe_dump(plan_data))
            answer = demo_actions(task, kind)[1]
            lines.append({"episode_id": episode_id, "task_id": task.task_id, "kind": kind, "answer": answer})
    (out / "demonstrations.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    kinds = {kind: sum(line["kind"] == kind for line in lines) for kind in sorted({line["kind"] for line in lines})}
    log.info("gui expert plans written", out=str(out), episodes=len(lines), **kinds)
    return lines


def setup(run_dir: Path, config: GuiSetupConfig, demos: DemoConfig) -> tuple[Path, Path]:
    """Write the tasks and plan the demonstrations under ``run_dir``; returns (tasks dir, demos dir)."""
    tasks_dir, demos_dir = run_dir / TASKS_DIR, run_dir / DEMOS_DIR
    manifest = tasks_dir / "manifest.json"
    if manifest.is_file():
        written = json.loads(manifest.read_text())["config"]
        if written != config.model_dump(mode="json"):
            raise ValueError(f"{manifest} was generated with other options ({written}); use another run directory")
        log.info("gui tasks already generated, kept", tasks=str(tasks_dir))
        tasks = suite_tasks(config)
    else:
        tasks = write_tasks(tasks_dir, config)
    write_demonstrations(tasks, demos_dir, demos)
    return tasks_dir, demos_dir


def families_named(value: str | Sequence[str]) -> tuple[str, ...]:
    """``all``, ``cpu``, a comma-separated list (the command line) or a list of names (a recipe's ``tasks:``)."""
    if not isinstance(value, str):
        return tuple(value)
    if value == "all":
        return tuple(FAMILIES)
    if value == "cpu":
        return CPU_FAMILIES
    return tuple(name.strip() for name in value.split(",") if name.strip())


def setup_arguments(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The keyword arguments of ``setup`` that the command line ``argv`` asks for."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, help="The run directory (tasks/, references/, demos/ go in it).")
    add_recipe_option(parser, "tasks: and expert: blocks")
    parser.add_argument(
        "--families",
        default="all",
        help="'all' (the whole suite), 'cpu' (the families that fit tiny-llama-8k's context: "
        f"{','.join(CPU_FAMILIES)}) or a comma-separated list.",
    )
    add_model_options(parser, SuiteConfig)
    parser.add_argument("--episodes-per-task", type=int, default=2, help="Demonstrations per train task.")
    parser.add_argument("--failing-fraction", type=float, default=0.3, help="Chance a later demonstration fails.")
    parser.add_argument("--expert-seed", type=int, default=0, help="Seed of the choice of imperfect demonstrations.")
    args = parse_with_recipe(parser, argv, RECIPE_BLOCKS)
    return {
        "run_dir": args.run_dir,
        "config": GuiSetupConfig(suite=model_from_options(args, SuiteConfig), families=families_named(args.families)),
        "demos": DemoConfig(
            episodes_per_task=args.episodes_per_task, failing_fraction=args.failing_fraction, seed=args.expert_seed
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.gui.setup RUN_DIR [--recipe RUN_DIR/recipe.yaml] [options]``."""
    setup(**setup_arguments(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
