"""A small synthetic trajectory dataset in the Orchard ``swe`` layout, for trying the imported-SFT recipe offline.

Each row is one made-up SWE episode of an agent with a ``shell`` tool: the issue, a ``grep`` for the broken
function, its source, a ``sed`` fix followed by the tests, their result, and a closing message. Nothing comes from a
real dataset. Rows with an even row number pass (the fix is right, every test passes); odd rows apply a wrong fix
and a test still fails. The columns are the ones ``orchard import --layout orchard-swe`` reads:

- ``messages``: the OpenAI chat messages (``role``, ``content``, ``tool_calls``, ``tool_call_id``), a JSON string;
- ``tools``: the tool definitions, a JSON string;
- ``metadata``: a JSON string with ``instance_id`` (the task), ``model`` (the teacher) and ``signals``
  (``{"tests_passed_fraction": ...}``); no ``trajectory_id``, so episode ids derive from the run, file and row;
- ``verify_status``: whether the final patch passed the tests (a boolean).

``--bad-rows N`` appends N malformed rows (their ``messages`` is not valid JSON); the import dead-letters them with
their row numbers and carries on. The same arguments always write the same file; the suffix of OUT picks Parquet
(``.parquet``) or JSONL (``.jsonl``).

Run: ``python -m recipes.imported_sft.sample_data OUT.parquet [--rows 32] [--bad-rows 0] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

TEACHER = "synthetic-teacher"
SYSTEM = "You are a software engineer. Use the shell tool to read and change files, then say what you did."
SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
MODULES = ("parser", "config", "report", "cache", "units", "dates", "paths", "table")
VERBS = ("count", "total", "scale", "merge", "trim", "parse", "clamp", "limit")
NOUNS = ("items", "rows", "values", "lines", "keys", "words", "fields", "pages")
OPERATORS = ("+", "-")
SCHEMA = pa.schema(
    [("messages", pa.string()), ("tools", pa.string()), ("metadata", pa.string()), ("verify_status", pa.bool_())]
)


@dataclass(frozen=True)
class SampleSummary:
    """What ``write_sample_dataset`` wrote: rows in all, how many pass, and the row numbers of the malformed ones."""

    rows: int
    successful: int
    bad_rows: tuple[int, ...]


def is_successful(index: int) -> bool:
    """Whether row ``index`` (0-based) of a generated dataset passes: the even ones do."""
    return index % 2 == 0


def _call(call_id: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": "shell", "arguments": arguments}}


def trajectory(index: int, rng: random.Random) -> dict[str, Any]:
    """Row ``index`` of the dataset: one synthetic episode, successful when ``is_successful(index)``."""
    module, verb, noun = rng.choice(MODULES), rng.choice(VERBS), rng.choice(NOUNS)
    function, path = f"{verb}_{noun}", f"src/{module}.py"
    offset, line, tests = rng.randint(1, 9), rng.randint(10, 90), rng.randint(2, 6)
    wrong = rng.choice(OPERATORS)
    right = "-" if wrong == "+" else "+"
    success = is_successful(index)
    fixed = f"len({noun}) {right} {offset}" if success else f"len({noun}) {wrong} {offset + 1}"
    passed = tests if success else tests - 1
    result = f"{passed} passed" if success else f"1 failed, {passed} passed"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Issue {index}: {function} in {path} is off by {offset}. Fix it."},
        {"role": "assistant", "content": f"I will look at {function}.",
         "tool_calls": [_call("call_0", f"grep -n 'def {function}' -A2 {path}")]},
        {"role": "tool", "tool_call_id": "call_0",
         "content": f"{line}:def {function}({noun}):\n{line + 1}:    return len({noun}) {wrong} {offset}"},
        {"role": "assistant", "content": f"The {wrong} {offset} is the bug. I will fix it and run the tests.",
         "tool_calls": [_call("call_1", f"sed -i '{line + 1}s/.*/    return {fixed}/' {path} && pytest -q")]},
        {"role": "tool", "tool_call_id": "call_1", "content": result},
        {"role": "assistant", "content": f"Done: {function} now returns {fixed}."},
    ]  # fmt: skip
    metadata = {"instance_id": f"synthetic__{module}-{index:05d}", "model": TEACHER,
                "signals": {"tests_passed_fraction": round(passed / tests, 4)}}  # fmt: skip
    return {"messages": json.dumps(messages), "tools": json.dumps([SHELL_TOOL]), "metadata": json.dumps(metadata),
            "verify_status": success}  # fmt: skip


def malformed_row(index: int) -> dict[str, Any]:
    """A row the import must dead-letter: its ``messages`` is cut off mid-JSON."""
    metadata = {"instance_id": f"synthetic__broken-{index:05d}", "model": TEACHER}
    return {"messages": '[{"role": "user", "content": "cut off', "tools": None, "metadata": json.dumps(metadata),
            "verify_status": True}  # fmt: skip


def sample_rows(rows: int, *, bad_rows: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """The dataset's rows: ``rows`` trajectories, then ``bad_rows`` malformed rows."""
    rng = random.Random(seed)  # noqa: S311 - made-up data, not secrets
    good = [trajectory(index, rng) for index in range(rows)]
    return good + [malformed_row(rows + n) for n in range(bad_rows)]


def write_sample_dataset(path: Path, rows: int = 32, *, bad_rows: int = 0, seed: int = 0) -> SampleSummary:
    """Write the dataset to ``path`` (Parquet, or JSONL when the suffix is ``.jsonl``); parent folders are made."""
    if rows < 0 or bad_rows < 0:
        raise ValueError(f"rows and bad_rows must be >= 0, got rows={rows}, bad_rows={bad_rows}")
    data = sample_rows(rows, bad_rows=bad_rows, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in data))
    else:
        pq.write_table(pa.Table.from_pylist(data, schema=SCHEMA), path)
    successful = sum(is_successful(index) for index in range(rows))
    return SampleSummary(rows + bad_rows, successful, tuple(range(rows, rows + bad_rows)))


def main(argv: list[str] | None = None) -> None:
    """Command line: write the dataset and print what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output file: .parquet or .jsonl")
    parser.add_argument("--rows", type=int, default=32, help="trajectories (even row numbers pass)")
    parser.add_argument("--bad-rows", type=int, default=0, help="malformed rows appended (dead-lettered on import)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the made-up issues")
    args = parser.parse_args(argv)
    if args.rows < 0 or args.bad_rows < 0:
        parser.error("--rows and --bad-rows must be >= 0")
    summary = write_sample_dataset(args.out, args.rows, bad_rows=args.bad_rows, seed=args.seed)
    sys.stdout.write(
        f"wrote {summary.rows} rows to {args.out}: {summary.successful} successful, "
        f"{args.rows - summary.successful} failed, {len(summary.bad_rows)} malformed\n"
    )


if __name__ == "__main__":
    main()
