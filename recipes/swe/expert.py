"""The scripted expert of the local SWE suite: plans that explore, apply the reference fix, test, and finish.

A plan is a ``ScriptedPlan`` for the scripted backend (``orchard.engines.scripted``); a real harness runs its tool
calls in the sandbox, the recording proxy records every call and the grader scores the end state, so an expert
episode is recorded exactly like an RL one. The expert knows the fix (it reads the suite's ``fix/``, which no task
directory holds) and acts like a careful engineer, one shell command per step:

1. list the repository's files (``find``), read each module the fix changes (``cat``), run the visible tests;
2. write each fixed file whole (a quoted shell heredoc, ``cat > path <<'EOF'``; a Python one-liner for a file a
   heredoc cannot reproduce byte for byte), then run the visible tests again;
3. finish the harness's own way.

``apply_fix=False`` gives the same exploration with no fix (a failing demonstration, graded ``f2p_fraction`` 0).

Each harness has its own dialect (``DIALECTS``), the one its adapter speaks:

==================  ===================================  ===========================================
dialect             a command                            the end
==================  ===================================  ===========================================
``builtin``         tool ``shell`` ``{"command": ...}``  tool ``submit`` ``{"summary": ...}``
``mini-swe-agent``  tool ``bash`` ``{"command": ...}``   ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
``codex``           tool ``exec_command`` ``{"cmd": …}``  a final text reply (no tool call)
==================  ===================================  ===========================================

Run: ``python -m recipes.swe.expert SUITE_DIR OUT_DIR [--harness builtin] [--split train] [--python python3]
[--no-fix]`` writes ``OUT_DIR/plans/<episode_id>.yaml`` (episode ids from ``expert_episode_id``), which
``orchard engine expert OUT_DIR`` serves by episode id.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, get_args

import yaml

from orchard.engines.scripted import ScriptedPlan, ScriptedStep, ScriptedToolCall
from orchard.logging import get_logger
from recipes.swe.instance import load_suite_instance, snapshot, suite_instances

log = get_logger("recipes.swe.expert")

Dialect = Literal["builtin", "mini-swe-agent", "codex"]
DIALECTS: tuple[Dialect, ...] = get_args(Dialect)
MINI_SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
MODEL = "swe-expert"
FINAL_TEXT = "done"
LIST_FILES = "find . -path ./.git -prune -o -type f -not -path '*/__pycache__/*' -print | sort"


def expert_episode_id(instance_id: str, harness: str, index: int = 0) -> str:
    """The id of expert episode ``index`` of an instance for a harness (what the plan command writes)."""
    return f"expert-{instance_id}-{harness}-{index}"


def fixed_files(instance_dir: Path) -> dict[str, bytes]:
    """The files the reference fix adds or changes (``fix/`` over ``repo/``), by path, with their fixed content."""
    base = snapshot(instance_dir / "repo")
    return {path: data for path, data in sorted(snapshot(instance_dir / "fix").items()) if base.get(path) != data}


def write_command(path: str, data: bytes, python: str = "python3", *, new: bool = False) -> str:
    """A shell command writing ``data`` to ``path``: a quoted heredoc when it reproduces the
    bytes exactly (UTF-8 text ending in a newline), else a Python one-liner carrying the bytes' literal. ``new``: the
    file does not exist yet (its directory is created first)."""
    quoted = shlex.quote(path)
    parent = path.rpartition("/")[0]
    mkdir = f"mkdir -p {shlex.quote(parent)} && " if new and parent else ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    lines = set(text.split("\n")) if text is not None else set()
    if text is not None and text.endswith("\n") and "\r" not in text:
        delimiter, n = "EOF", 0
        while delimiter in lines:  # the delimiter must not be a line of the content
            n += 1
            delimiter = f"EOF_{n}"
        return f"{mkdir}cat > {quoted} <<'{delimiter}'\n{text}{delimiter}"
    script = f"import pathlib; pathlib.Path({path!r}).write_bytes({data!r})"
    return f"{mkdir}{python} -c {shlex.quote(script)}"


def expert_commands(instance_dir: Path, *, python: str = "python3", apply_fix: bool = True) -> list[str]:
    """The expert's shell commands for the suite instance at ``instance_dir``, in order (the finish not included).

    ``python``: the interpreter that has pytest inside the sandbox (the one the grade command uses)."""
    fixed = fixed_files(instance_dir)
    base = snapshot(instance_dir / "repo")
    tests = f"{python} -m pytest -q -p no:cacheprovider"
    # read what the fix changes; a fix adding a module reads the package it joins instead
    read = [path for path in fixed if path in base] or sorted(
        {path for new in fixed for path in base if path.rpartition("/")[0] == new.rpartition("/")[0]}
    )
    commands = [LIST_FILES, *(f"cat {shlex.quote(path)}" for path in read), tests]
    if apply_fix:
        commands += [write_command(path, data, python, new=path not in base) for path, data in fixed.items()]
        commands.append(tests)
    return commands


def _say(text: str, command: str) -> str:
    if command == LIST_FILES:
        return "Let me look at the repository layout first."
    if command.startswith("cat ") and "<<" not in command:
        return f"Reading {command[4:]} to find the cause."
    if "pytest" in command:
        return "Running the test suite."
    return text


def dialect_steps(commands: Sequence[str], dialect: Dialect, summary: str = FINAL_TEXT) -> list[ScriptedStep]:
    """``commands`` as the steps of a harness's dialect, one command per step, then the harness's own finish."""
    if dialect == "builtin":
        steps = [_tool("shell", {"command": command}) for command in commands]
        return [*steps, _tool("submit", {"summary": summary})]
    if dialect == "mini-swe-agent":
        steps = [_tool("bash", {"command": c}, text=_say("Applying the fix.", c)) for c in commands]
        return [*steps, _tool("bash", {"command": f"echo {MINI_SUBMIT}"}, text=summary)]
    if dialect == "codex":
        return [*(_tool("exec_command", {"cmd": command}) for command in commands), ScriptedStep(text=summary)]
    raise ValueError(f"dialect: unknown harness dialect {dialect!r} (known: {', '.join(DIALECTS)})")


def _tool(name: str, arguments: dict[str, str], text: str = "") -> ScriptedStep:
    return ScriptedStep(text=text, tool_calls=[ScriptedToolCall(name=name, arguments=arguments)])


def expert_plan(
    instance_dir: Path,
    dialect: Dialect,
    *,
    python: str = "python3",
    apply_fix: bool = True,
    model: str = MODEL,
) -> ScriptedPlan:
    """The expert's plan for the suite instance at ``instance_dir`` in ``dialect`` (see the module docstring)."""
    instance = load_suite_instance(instance_dir)
    summary = (
        f"Fixed {instance.instance_id}: rewrote {', '.join(fixed_files(instance_dir))}; the tests pass."
        if apply_fix
        else f"Looked into {instance.instance_id}; no change made."
    )
    steps = dialect_steps(expert_commands(instance_dir, python=python, apply_fix=apply_fix), dialect, summary)
    return ScriptedPlan(steps=steps, final_text=FINAL_TEXT, model=model)


def write_plans(
    suite: Path,
    out: Path,
    dialect: Dialect,
    *,
    split: Literal["train", "eval", "all"] = "train",
    python: str = "python3",
    apply_fix: bool = True,
) -> list[str]:
    """Write one plan per suite instance of ``split`` under ``out/plans/<episode_id>.yaml``; returns the episode ids."""
    (out / "plans").mkdir(parents=True, exist_ok=True)
    written = []
    for instance_dir in suite_instances(suite):
        instance = load_suite_instance(instance_dir)
        if split not in ("all", instance.split):
            continue
        episode_id = expert_episode_id(instance.instance_id, dialect)
        plan = expert_plan(instance_dir, dialect, python=python, apply_fix=apply_fix)
        (out / "plans" / f"{episode_id}.yaml").write_text(yaml.safe_dump(plan.model_dump(mode="json")))
        written.append(episode_id)
    (out / "episodes.json").write_text(json.dumps(written, indent=1) + "\n")
    log.info("swe expert plans written", out=str(out), dialect=dialect, episodes=len(written), fix=apply_fix)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.swe.expert SUITE_DIR OUT_DIR [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.swe.expert", description=__doc__.split("\n")[0])
    parser.add_argument("suite", type=Path, help="The suite directory (recipes/swe/suite).")
    parser.add_argument("out", type=Path, help="Where plans/ and episodes.json go.")
    parser.add_argument("--harness", choices=DIALECTS, default="builtin", help="The harness whose dialect to speak.")
    parser.add_argument("--split", choices=("train", "eval", "all"), default="train")
    parser.add_argument("--python", default="python3", help="Interpreter with pytest inside the sandbox.")
    parser.add_argument("--no-fix", action="store_true", help="Explore and test only (failing demonstrations).")
    args = parser.parse_args(argv)
    write_plans(args.suite, args.out, args.harness, split=args.split, python=args.python, apply_fix=not args.no_fix)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
