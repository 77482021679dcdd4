"""The Claw scripted expert: each task's reference solution as a ``ScriptedPlan``, so demonstrations are recorded
through the real Claw agent, sandbox, services, recording proxy and grader, exactly like RL episodes.

A plan is one step per tool call of the solution (each a single tool call the agent runs against the services),
then ``submit``. A configurable share of demonstrations replays the task's wrong solution instead (graded as a
failure with partial-progress signals: material for credit-assignment SFT). Which one an episode gets is a pure
function of the seed and the episode id.

Plans are served by ``orchard.engines.expert.ExpertBackend`` (one OpenAI-compatible app, a plan per episode id).

Run: ``python -m recipes.claw.expert plan TASKS_OUT OUT_DIR [--split train] [--episodes-per-task 1]
[--wrong-fraction 0] [--seed 0]`` writes ``OUT_DIR/plans/<episode_id>.yaml`` and ``OUT_DIR/demonstrations.jsonl``;
``python -m recipes.claw.expert serve OUT_DIR --port 8000`` serves them.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from orchard.engines.expert import serve_expert
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.episode_groups import demo_episode_id
from orchard.logging import get_logger
from recipes.claw.tasks import SOLUTIONS_DIR, Split

log = get_logger("recipes.claw.expert")
MODEL = "claw-expert"
FINAL_TEXT = "done"


def solution_plan(calls: Sequence[dict[str, Any]], model: str = MODEL, summary: str = "done") -> ScriptedPlan:
    """The plan carrying out ``calls`` (``{"name", "arguments"}`` each), one per step, then ``submit``."""
    steps = [ScriptedStep(tool_calls=[ScriptedToolCall(name=c["name"], arguments=c["arguments"])]) for c in calls]
    steps.append(ScriptedStep(tool_calls=[ScriptedToolCall(name="submit", arguments={"summary": summary})]))
    return ScriptedPlan(steps=steps, final_text=FINAL_TEXT, model=model)


def choose(episode_id: str, wrong_fraction: float, seed: int = 0) -> str:
    """``reference`` or ``wrong``: which solution episode ``episode_id`` demonstrates."""
    rng = random.Random(f"claw-expert:{seed}:{episode_id}")  # noqa: S311 - data, not secrets
    return "wrong" if rng.random() < wrong_fraction else "reference"


def write_demonstrations(
    tasks_out: Path,
    out: Path,
    split: Split = "train",
    episodes_per_task: int = 1,
    wrong_fraction: float = 0.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Plan ``episodes_per_task`` demonstrations of every task of ``split`` (solutions read from ``tasks_out``)."""
    (out / "plans").mkdir(parents=True, exist_ok=True)
    summaries = []
    for path in sorted((tasks_out / SOLUTIONS_DIR / split).glob("*.json")):
        solutions = json.loads(path.read_text(encoding="utf-8"))
        for index in range(episodes_per_task):
            episode_id = demo_episode_id(solutions["task_id"], index)
            which = choose(episode_id, wrong_fraction, seed)
            plan = solution_plan(solutions[which])
            (out / "plans" / f"{episode_id}.yaml").write_text(
                yaml.safe_dump(plan.model_dump(mode="json", exclude_defaults=True))
            )
            summaries.append({"episode_id": episode_id, "task_id": solutions["task_id"], "solution": which})
    (out / "demonstrations.jsonl").write_text("".join(json.dumps(s) + "\n" for s in summaries))
    log.info("claw expert plans written", out=str(out), episodes=len(summaries))
    return summaries


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``plan TASKS_OUT OUT_DIR`` or ``serve OUT_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.claw.expert", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="Write one scripted plan per demonstration episode.")
    plan.add_argument("tasks", type=Path, help="The generator's output directory (holds solutions/).")
    plan.add_argument("out", type=Path)
    plan.add_argument("--split", choices=["train", "eval"], default="train")
    plan.add_argument("--episodes-per-task", type=int, default=1)
    plan.add_argument("--wrong-fraction", type=float, default=0.0)
    plan.add_argument("--seed", type=int, default=0)
    server = commands.add_parser("serve", help="Serve the plans of OUT_DIR as an OpenAI-compatible backend.")
    server.add_argument("out", type=Path)
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--policy-version", type=int, default=0)
    server.add_argument("--tokenizer", default="tiny", help="The policy's tokenizer: tiny, a directory, or none.")
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve_expert(args.out, args.host, args.port, args.policy_version, args.tokenizer)
        return 0
    write_demonstrations(args.tasks, args.out, args.split, args.episodes_per_task, args.wrong_fraction, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
