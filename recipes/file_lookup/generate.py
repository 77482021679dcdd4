"""Generates the file-lookup task family: seeded, deterministic train and held-out eval splits of Orchard task dirs.

A task's workspace holds a few small files (``owl.txt``, ``dog.txt``, ...), each a few ``key: value`` lines with
three-digit values, unique within the task. The instruction names one file and one key::

    Write the value of y in owl.txt to answer.txt.

An agent solves it in three model calls with the built-in harness: ``shell`` ``cat owl.txt``, ``shell``
``echo 417 > answer.txt``, ``submit``. It is small enough for a tiny model to learn on CPU (copy a file name from
the instruction, copy a value from a tool result, stop), yet every call goes through the real sandbox, proxy and
grader. ``grade.py`` (shipped at the top of each task's ``hidden/``) documents the reward and signals.

The two-hop variant (``hops=2``) adds a pointer file, ``index.txt`` (``file: owl.txt``), and the instruction names
it instead of the file::

    Write the value of y in the file named in index.txt to answer.txt.

so the file name to copy comes from a tool result too: ``cat index.txt``, ``cat owl.txt``, ``echo 417 > answer.txt``,
``submit``.

Layout written by ``generate``::

    OUT/manifest.json                  the config, and each split's task ids
    OUT/train/<task_id>/task.yaml      one task directory each (``orchard.env.tasks.load_task`` reads it)
                       /workspace/*.txt                   (with ``hops=2`` also index.txt)
                       /hidden/grade.py, reference.txt    the grader (run from outside the working copy)
    OUT/eval/<task_id>/...             the held-out split: no task shares its instruction and files with a train task

The same config always writes byte-identical trees. The eval split is drawn from its own random stream, so it does
not change when the number of train tasks does.

Run: ``python -m recipes.file_lookup.generate OUT [--seed 0] [--train-tasks 1000] [--eval-tasks 256] [--hops 1]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchard.logging import get_logger
from recipes.file_lookup.grade import REFERENCE_NAME, format_reference, parse_reference
from recipes.model_options import add_model_options, model_from_options

log = get_logger("recipes.file_lookup")

FILE_NAMES = ("owl", "dog", "cat", "bee", "ant", "cow", "pig", "hen", "elk", "yak", "emu", "fox")
"""Workspace file stems: short words the tiny tokenizer splits into few pieces."""
KEYS = ("x", "y", "z", "w")
VALUE_RANGE = (100, 999)
"""Values are three-digit numbers: a guess almost never hits a workspace value, so a copied value is evidence."""
ANSWER_FILE = "answer.txt"
INDEX_FILE = "index.txt"
"""The two-hop task's pointer file: one ``file: <name>`` line naming the file the instruction means."""
GRADE_SCRIPT = Path(__file__).resolve().parent / "grade.py"
GRADE_COMMAND = 'python3 -I -S "$ORCHARD_GRADER_DIR/grade.py"'
"""The Env places ``hidden/`` in ``$ORCHARD_GRADER_DIR``; ``-I`` keeps the working copy off the grader's path;
``-S`` skips ``site`` (the grader needs nothing installed, and every episode pays for its start)."""
REFERENCE_FILE = REFERENCE_NAME
Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")


class LookupConfig(BaseModel):
    """What to generate; every field is also a command-line option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="Seed of both splits' random streams.")
    train_tasks: int = Field(1000, ge=0, description="Tasks in the train split.")
    eval_tasks: int = Field(256, ge=1, description="Tasks in the held-out eval split.")
    files_per_task: int = Field(3, ge=1, le=len(FILE_NAMES), description="Files in each workspace.")
    keys_per_file: int = Field(2, ge=1, le=len(KEYS), description="key: value lines in each file.")
    max_steps: int = Field(
        6, ge=2, description="Model calls the harness may make (the expert needs 2 to 4, with hops=2 up to 5)."
    )
    value_min: int = Field(
        VALUE_RANGE[0],
        ge=VALUE_RANGE[0],
        le=VALUE_RANGE[1],
        description="Smallest workspace value (three digits). The recipe uses 500: the tiny tokenizer merges a "
        "space with a first digit 1-4 into one token, which the tiny model cannot tell apart (README, stop 26).",
    )
    value_max: int = Field(VALUE_RANGE[1], ge=VALUE_RANGE[0], le=VALUE_RANGE[1], description="Largest workspace value.")
    harness_timeout_s: float = Field(120.0, gt=0, description="Wall-clock limit of the harness.")
    grade_timeout_s: float = Field(30.0, gt=0, description="Wall-clock limit of the grader.")
    hops: int = Field(
        1,
        ge=1,
        le=2,
        description="1: the instruction names the file. 2: it names index.txt, a workspace file naming the file "
        "(the agent reads index.txt, then the file it names).",
    )

    @model_validator(mode="after")
    def _enough_values(self) -> LookupConfig:
        if self.value_min > self.value_max:
            raise ValueError(f"value_min ({self.value_min}) is above value_max ({self.value_max})")
        if self.files_per_task * self.keys_per_file > (self.value_max - self.value_min + 1) // 2:
            raise ValueError(
                f"files_per_task * keys_per_file is too large for unique values in [{self.value_min}, {self.value_max}]"
            )
        return self


ADDED_FIELDS = ("value_min", "value_max", "hops")
"""``LookupConfig`` fields added after splits had been written: left out of a manifest while at their default, so
the manifests of existing splits (and ``setup``'s check of a run directory against them) stay as they were."""


def config_record(config: LookupConfig) -> dict[str, Any]:
    """``config`` as manifests record it: every field, but an ``ADDED_FIELDS`` one only when it is not its default."""
    defaults = {name for name in ADDED_FIELDS if getattr(config, name) == LookupConfig.model_fields[name].default}
    return config.model_dump(exclude=defaults)


@dataclass(frozen=True)
class LookupTask:
    """One task: its value files (stem.txt -> key -> value), which file and key the answer is, and how many hops
    (2: the instruction names ``index.txt``, whose one line names the file)."""

    task_id: str
    files: dict[str, dict[str, str]]
    file: str
    key: str
    hops: int = 1

    @property
    def answer(self) -> str:
        """The reference answer."""
        return self.files[self.file][self.key]

    @property
    def instruction(self) -> str:
        """The task text the harness is given."""
        where = self.file if self.hops == 1 else f"the file named in {INDEX_FILE}"
        return f"Write the value of {self.key} in {where} to {ANSWER_FILE}."

    @property
    def workspace_names(self) -> list[str]:
        """The workspace's file names, sorted: the value files, and ``index.txt`` in a two-hop task."""
        return sorted([*self.files, INDEX_FILE] if self.hops == 2 else self.files)

    def file_text(self, name: str) -> str:
        """The content of workspace file ``name``."""
        if self.hops == 2 and name == INDEX_FILE:
            return f"file: {self.file}\n"  # the value files' "key: value" shape, so it reads (and tokenizes) alike
        # "key: value", not "key=value": the tiny tokenizer then splits " 417" in the file exactly as in
        # "echo 417 > answer.txt" (a space-prefixed first digit), so copying the value is copying tokens.
        return "".join(f"{key}: {value}\n" for key, value in self.files[name].items())

    @property
    def fingerprint(self) -> str:
        """What makes two tasks the same task (id aside): instruction and workspace content."""
        # a two-hop instruction does not name the file, so the index's target is added (one-hop bodies unchanged)
        body = json.dumps([self.instruction, self.files, *([self.file] if self.hops == 2 else [])], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def reference(self) -> dict[str, Any]:
        """The grader's reference (written as ``reference.txt``, ``grade.format_reference``); ``hops`` only when 2,
        so one-hop references stay as they were."""
        hops = {"hops": str(self.hops)} if self.hops == 2 else {}
        return {"file": self.file, "key": self.key, "answer": self.answer, **hops, "files": self.files}

    @classmethod
    def from_directory(cls, directory: Path) -> LookupTask:
        """Read a task back from its directory (its id from ``task.yaml``, the rest from the hidden reference)."""
        spec = yaml.safe_load((directory / "task.yaml").read_text())
        reference = parse_reference((directory / "hidden" / REFERENCE_FILE).read_text())
        file, key, hops = str(reference["file"]), str(reference["key"]), int(str(reference.get("hops", 1)))
        return cls(spec["task_id"], reference["files"], file, key, hops)


def sample_task(rng: random.Random, config: LookupConfig, task_id: str) -> LookupTask:
    """A random task: ``files_per_task`` files of ``keys_per_file`` lines, values unique within the task.

    The draws are the same for every ``hops``: a two-hop task is its one-hop task with the file named by the index
    (the index's content follows from the file, so it draws nothing)."""
    stems = rng.sample(FILE_NAMES, config.files_per_task)
    values = iter(
        rng.sample(range(config.value_min, config.value_max + 1), config.files_per_task * config.keys_per_file)
    )
    files = {
        f"{stem}.txt": {key: str(next(values)) for key in sorted(rng.sample(KEYS, config.keys_per_file))}
        for stem in stems
    }
    file = rng.choice(sorted(files))
    return LookupTask(task_id, files, file, rng.choice(sorted(files[file])), config.hops)


def generate_tasks(config: LookupConfig) -> dict[Split, list[LookupTask]]:
    """Both splits, eval first: train tasks never repeat an eval task (or each other)."""
    seen: set[str] = set()
    out: dict[Split, list[LookupTask]] = {}
    for split, count in (("eval", config.eval_tasks), ("train", config.train_tasks)):
        # a str seed hashes the same in every process; this is task data, not a secret
        rng = random.Random(f"file-lookup:{config.seed}:{split}")  # noqa: S311
        tasks: list[LookupTask] = []
        while len(tasks) < count:
            task = sample_task(rng, config, f"file-lookup-{split}-{len(tasks):05d}")
            if task.fingerprint not in seen:
                seen.add(task.fingerprint)
                tasks.append(task)
        out[split] = tasks
    return {split: out[split] for split in SPLITS}


def task_yaml(task: LookupTask, config: LookupConfig) -> str:
    """The task's ``task.yaml`` (fields of ``orchard.env.tasks.TaskSpec``)."""
    spec = {
        "task_id": task.task_id,
        "instruction": task.instruction,
        "grade_command": GRADE_COMMAND,
        "grade_timeout_s": config.grade_timeout_s,
        "harness_timeout_s": config.harness_timeout_s,
        "max_steps": config.max_steps,
    }
    return yaml.safe_dump(spec, sort_keys=False)


def write_task(task: LookupTask, config: LookupConfig, directory: Path) -> Path:
    """Write one task directory; returns it."""
    (directory / "workspace").mkdir(parents=True)
    for name in task.workspace_names:
        (directory / "workspace" / name).write_text(task.file_text(name))
    hidden = directory / "hidden"
    hidden.mkdir(parents=True)
    shutil.copyfile(GRADE_SCRIPT, hidden / "grade.py")
    (hidden / REFERENCE_FILE).write_text(format_reference(task.reference()))
    (directory / "task.yaml").write_text(task_yaml(task, config))
    return directory


def generate(config: LookupConfig, out: Path, *, overwrite: bool = False) -> dict[Split, list[LookupTask]]:
    """Write both splits and ``manifest.json`` under ``out``; refuses a non-empty ``out`` unless ``overwrite``."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    splits = generate_tasks(config)
    for split, tasks in splits.items():
        for task in tasks:
            write_task(task, config, out / split / task.task_id)
    manifest = {
        "recipe": "file_lookup",
        "config": config_record(config),
        "splits": {split: [task.task_id for task in tasks] for split, tasks in splits.items()},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log.info("file-lookup tasks written", out=str(out), **{split: len(tasks) for split, tasks in splits.items()})
    return splits


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.file_lookup.generate OUT [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.file_lookup.generate", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="Output directory (train/, eval/, manifest.json).")
    add_model_options(parser, LookupConfig)
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output directory.")
    args = parser.parse_args(argv)
    generate(model_from_options(args, LookupConfig), args.out, overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
