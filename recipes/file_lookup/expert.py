"""The scripted expert of the file-lookup recipe: demonstrations that run through the real harness and proxy.

The expert is a plan per episode for the scripted backend (``orchard.engines.scripted``): the built-in harness runs
the plan's tool calls in the sandbox, the recording proxy records every call, and the grader scores the end state —
so SFT data is recorded exactly like RL data. The expert knows the answer (it reads the task's hidden reference);
a configurable fraction of its demonstrations are imperfect on purpose, each kind with a known grade:

====================  ====================================================  ========  ========  =====
kind                  tool calls                                            success   progress  calls
====================  ====================================================  ========  ========  =====
``perfect``           cat FILE; echo VALUE > answer.txt; submit             yes       1.0       3
``wrong_file_first``  cat OTHER; cat FILE; echo VALUE > answer.txt; submit  yes       1.0       4
``wrong_key``         cat FILE; echo (other key's value) > answer.txt; sub  no        0.5       3
``wrong_file``        cat OTHER; echo (OTHER's value) > answer.txt; submit  no        0.2       3
``no_read``           echo (a guess) > answer.txt; submit                   no        0.2       2
``no_answer``         cat FILE; submit                                      no        0.0       2
====================  ====================================================  ========  ========  =====

(``wrong_key`` needs two keys per file, the ``OTHER`` kinds two files; where a task lacks them the expert falls back
to ``wrong_file`` or ``no_read``.) In a two-hop task (``hops=2``) every kind that reads a file first runs ``cat
index.txt``, one call more with the same grade (``wrong_file`` then reads a file other than the one the index
named); ``no_read`` still reads nothing. Which kind an episode gets is a pure function of the seed and the episode id.

The plans are served by Orchard's expert backend (``orchard.engines.expert.ExpertBackend``): one OpenAI-compatible
ASGI app for many episodes, answering each request with the plan of the episode the recording proxy names in
``X-Orchard-Episode-Id``.

Run: ``python -m recipes.file_lookup.expert plan TASKS_DIR OUT_DIR [--episodes-per-task 1] [--imperfect-fraction
0.3] [--seed 0]`` writes ``OUT_DIR/plans/<episode_id>.yaml`` (one ``ScriptedPlan`` each; episode ids from
``orchard.episode_groups.demo_episode_id``) and ``OUT_DIR/demonstrations.jsonl`` (episode id, task id, kind, answer);
``python -m recipes.file_lookup.expert serve OUT_DIR --port 8000`` serves them (``orchard engine expert OUT_DIR`` with
this expert's model id).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchard.engines.expert import serve_expert
from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.episode_groups import demo_episode_id
from orchard.logging import get_logger
from recipes.file_lookup.generate import ANSWER_FILE, INDEX_FILE, VALUE_RANGE, LookupTask

log = get_logger("recipes.file_lookup.expert")

FINAL_TEXT = "done"


class DemoKind(StrEnum):
    """How a demonstration goes (the module docstring has each kind's tool calls and grade)."""

    PERFECT = "perfect"
    WRONG_FILE_FIRST = "wrong_file_first"
    WRONG_KEY = "wrong_key"
    WRONG_FILE = "wrong_file"
    NO_READ = "no_read"
    NO_ANSWER = "no_answer"


IMPERFECT_KINDS = tuple(kind for kind in DemoKind if kind is not DemoKind.PERFECT)


class ExpertConfig(BaseModel):
    """How the expert mixes perfect and imperfect demonstrations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seed of the per-episode choice of kind.")
    imperfect_fraction: float = Field(0.3, ge=0, le=1, description="Share of episodes given an imperfect kind.")
    imperfect_kinds: tuple[DemoKind, ...] = Field(
        IMPERFECT_KINDS, min_length=1, description="Imperfect kinds to draw from, uniformly."
    )
    model: str = Field("file-lookup-expert", min_length=1, description="Model id the backend lists.")


@dataclass(frozen=True)
class Demonstration:
    """One episode's plan, and what the expert wrote as the answer (``None``: nothing)."""

    episode_id: str
    task_id: str
    kind: DemoKind
    plan: ScriptedPlan
    answer: str | None


def shell(command: str) -> ScriptedStep:
    """A step running one shell command."""
    return ScriptedStep(tool_calls=[ScriptedToolCall(name="shell", arguments={"command": command})])


def submit() -> ScriptedStep:
    """The step ending the episode."""
    return ScriptedStep(tool_calls=[ScriptedToolCall(name="submit", arguments={"summary": FINAL_TEXT})])


def write(value: str) -> ScriptedStep:
    """A step writing ``value`` to the answer file."""
    return shell(f"echo {value} > {ANSWER_FILE}")


class Expert:
    """Builds demonstrations; the kind of each is a pure function of the seed and the episode id."""

    def __init__(self, config: ExpertConfig | None = None) -> None:
        self.config = config or ExpertConfig()

    def kind_for(self, episode_id: str) -> DemoKind:
        """The kind of demonstration episode ``episode_id`` gets."""
        rng = random.Random(f"file-lookup-expert:{self.config.seed}:{episode_id}")  # noqa: S311 - data, not secrets
        if rng.random() >= self.config.imperfect_fraction:
            return DemoKind.PERFECT
        return rng.choice(self.config.imperfect_kinds)

    def demonstrate(self, task: LookupTask, episode_id: str, kind: DemoKind | None = None) -> Demonstration:
        """The demonstration of ``task`` for ``episode_id`` (of ``kind`` when given, else ``kind_for``)."""
        kind = _feasible(task, kind or self.kind_for(episode_id))
        rng = random.Random(f"file-lookup-expert:{self.config.seed}:{episode_id}:detail")  # noqa: S311
        steps, answer = _steps(task, kind, rng)
        plan = ScriptedPlan(steps=steps, final_text=FINAL_TEXT, model=self.config.model)
        return Demonstration(episode_id, task.task_id, kind, plan, answer)


def _feasible(task: LookupTask, kind: DemoKind) -> DemoKind:
    """``kind``, or the nearest kind the task allows (one file has no other file; one key has no other key)."""
    if kind is DemoKind.WRONG_KEY and len(task.files[task.file]) < 2:
        kind = DemoKind.WRONG_FILE
    if kind in (DemoKind.WRONG_FILE, DemoKind.WRONG_FILE_FIRST) and len(task.files) < 2:
        kind = DemoKind.NO_READ
    return kind


def _steps(task: LookupTask, kind: DemoKind, rng: random.Random) -> tuple[list[ScriptedStep], str | None]:
    """The kind's tool calls; in a two-hop task, a kind that reads any file reads the index first."""
    steps, answer = _lookup_steps(task, kind, rng)
    if task.hops == 2 and kind is not DemoKind.NO_READ:  # the index read draws nothing: the rest is as with one hop
        steps = [shell(f"cat {INDEX_FILE}"), *steps]
    return steps, answer


def _lookup_steps(task: LookupTask, kind: DemoKind, rng: random.Random) -> tuple[list[ScriptedStep], str | None]:
    """The kind's tool calls once the agent knows the file's name (from the instruction or the index)."""
    others = sorted(name for name in task.files if name != task.file)
    read = shell(f"cat {task.file}")
    if kind is DemoKind.PERFECT:
        return [read, write(task.answer), submit()], task.answer
    if kind is DemoKind.WRONG_FILE_FIRST:
        return [shell(f"cat {rng.choice(others)}"), read, write(task.answer), submit()], task.answer
    if kind is DemoKind.WRONG_KEY:
        value = task.files[task.file][rng.choice(sorted(k for k in task.files[task.file] if k != task.key))]
        return [read, write(value), submit()], value
    if kind is DemoKind.WRONG_FILE:
        other = rng.choice(others)
        value = task.files[other].get(task.key) or rng.choice(sorted(task.files[other].values()))
        return [shell(f"cat {other}"), write(value), submit()], value
    if kind is DemoKind.NO_READ:
        taken = {value for values in task.files.values() for value in values.values()}
        guess = rng.choice([str(v) for v in range(VALUE_RANGE[0], VALUE_RANGE[1] + 1) if str(v) not in taken])
        return [write(guess), submit()], guess
    return [read, submit()], None


def write_demonstrations(tasks_dir: Path, out: Path, expert: Expert, episodes_per_task: int = 1) -> list[Demonstration]:
    """Plan ``episodes_per_task`` demonstrations of every task under ``tasks_dir`` into ``out``."""
    (out / "plans").mkdir(parents=True, exist_ok=True)
    demos: list[Demonstration] = []
    for directory in sorted(d for d in tasks_dir.iterdir() if d.is_dir()):
        task = LookupTask.from_directory(directory)
        for index in range(episodes_per_task):
            demo = expert.demonstrate(task, demo_episode_id(task.task_id, index))
            (out / "plans" / f"{demo.episode_id}.yaml").write_text(
                yaml.safe_dump(demo.plan.model_dump(mode="json", exclude_defaults=True))
            )
            demos.append(demo)
    lines = [_summary(demo) for demo in demos]
    (out / "demonstrations.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    log.info("expert plans written", out=str(out), episodes=len(demos), kinds=_counts(demos))
    return demos


def _summary(demo: Demonstration) -> dict[str, Any]:
    return {"episode_id": demo.episode_id, "task_id": demo.task_id, "kind": demo.kind.value, "answer": demo.answer}


def _counts(demos: Sequence[Demonstration]) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for demo in demos:
        counts[demo.kind.value] = counts.get(demo.kind.value, 0) + 1
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.file_lookup.expert plan TASKS_DIR OUT_DIR`` or ``... serve OUT_DIR``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.file_lookup.expert", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="Write one scripted plan per demonstration episode.")
    plan.add_argument("tasks", type=Path, help="A split directory written by the generator (e.g. OUT/train).")
    plan.add_argument("out", type=Path, help="Where plans/ and demonstrations.jsonl go.")
    plan.add_argument("--episodes-per-task", type=int, default=1)
    plan.add_argument("--imperfect-fraction", type=float, default=ExpertConfig().imperfect_fraction)
    plan.add_argument("--seed", type=int, default=0)
    server = commands.add_parser("serve", help="Serve the plans of OUT_DIR as an OpenAI-compatible backend.")
    server.add_argument("out", type=Path, help="A directory written by the plan command.")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument("--policy-version", type=int, default=0)
    server.add_argument("--tokenizer", default="tiny", help="The policy's tokenizer: tiny, a directory, or none.")
    server.add_argument(
        "--latency-s",
        type=float,
        default=0.0,
        help="Answer each episode's request this many seconds after it arrived (default 0).",
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.latency_s < 0:
            parser.error(f"--latency-s must be >= 0, got {args.latency_s}")
        serve_expert(
            args.out, args.host, args.port, args.policy_version, args.tokenizer, args.latency_s, ExpertConfig().model
        )
        return 0
    config = ExpertConfig(seed=args.seed, imperfect_fraction=args.imperfect_fraction)
    write_demonstrations(args.tasks, args.out, Expert(config), args.episodes_per_task)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
