"""The file-lookup grader: run over the episode's working copy after the harness exits, standard library only.

The generator ships this file at the top of every task's ``hidden/`` with the task's ``reference.json``; once the
agent is gone the Env places both in a read-only directory outside the working copy (``$ORCHARD_GRADER_DIR``) and
runs ``python3 -I "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy. It reads the agent's ``answer.txt`` (the
working copy is input only: nothing of it is imported), writes ``$ORCHARD_GRADER_OUT/signals.json`` and exits 0 only
when the answer is exactly the reference value.

Signals (all 0 or 1, except ``progress``):

==================  ==========================================================================================
``answer_written``  ``answer.txt`` exists and is not blank
``answer_format``   its stripped content is one value, written as the values are (three digits)
``right_file``      it holds exactly one number, a value of the file the task named: the right file was read
                    (an answer listing many numbers earns nothing for them; values are unique
                    within a task, so a copied value says which file it came from)
``answer_correct``  its stripped content is the reference value (the exit status says the same)
``progress``        partial credit in [0, 1]: 1.0 when correct, else ``0.3 * right_file + 0.2 * answer_format``
==================  ==========================================================================================

So a value copied from the right file but for the wrong key earns 0.5, a well-formed value from another file (or a
guess) 0.2, a right value wrapped in extra text (``y=417``) 0.3, no answer 0.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ANSWER_FILE = "answer.txt"
OUT_ENV = "ORCHARD_GRADER_OUT"
SIGNALS_NAME = "signals.json"
REFERENCE_FILE = Path(__file__).resolve().parent / "reference.json"
RIGHT_FILE_CREDIT = 0.3
FORMAT_CREDIT = 0.2
MAX_ANSWER_BYTES = 4096
VALUE_PATTERN = re.compile(r"^[0-9]{3}$")
NUMBER = re.compile(r"[0-9]+")


def score(answer: str | None, reference: Mapping[str, Any]) -> dict[str, float]:
    """The signals of ``answer`` (the content of ``answer.txt``, ``None`` when absent) against ``reference``.

    >>> ref = {"file": "owl.txt", "key": "y", "answer": "417", "files": {"owl.txt": {"x": "233", "y": "417"}}}
    >>> score("417\\n", ref)["progress"], score("233", ref)["progress"], score(None, ref)["progress"]
    (1.0, 0.5, 0.0)
    """
    text = (answer or "").strip()
    target_values = set(reference["files"][reference["file"]].values())
    written = bool(text)
    well_formed = bool(VALUE_PATTERN.match(text))
    numbers = NUMBER.findall(text)
    right_file = len(numbers) == 1 and numbers[0] in target_values  # one value: a list of every number earns nothing
    correct = text == reference["answer"]
    progress = 1.0 if correct else RIGHT_FILE_CREDIT * right_file + FORMAT_CREDIT * well_formed
    return {
        "answer_written": float(written),
        "answer_format": float(well_formed),
        "right_file": float(right_file),
        "answer_correct": float(correct),
        "progress": round(progress, 6),
    }


def within(path: Path, root: Path) -> bool:
    """Whether ``path``, links resolved, is inside ``root`` (an answer linked to the grader's own reference is not)."""
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def read_answer(workdir: Path) -> str | None:
    """The start of ``answer.txt`` as text, or ``None`` when it is not a readable regular file of the working copy."""
    path = workdir / ANSWER_FILE
    if not path.is_file() or not within(path, workdir):  # a FIFO or device would block or never end
        return None
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_ANSWER_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def signals_path() -> Path:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return Path(out) / SIGNALS_NAME


def main() -> int:
    """Grade the current directory; exit status 0 only for a correct answer."""
    target = signals_path()
    reference = json.loads(REFERENCE_FILE.read_text(encoding="utf-8"))
    signals = score(read_answer(Path.cwd()), reference)
    target.write_text(json.dumps(signals, sort_keys=True) + "\n", encoding="utf-8")
    sys.stdout.write(json.dumps(signals, sort_keys=True) + "\n")
    return 0 if signals["answer_correct"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
