"""The file-lookup grader: run over the episode's working copy after the harness exits, standard library only.

The generator ships this file at the top of every task's ``hidden/`` with the task's ``reference.txt``; once the
agent is gone the Env places both in a read-only directory outside the working copy (``$ORCHARD_GRADER_DIR``) and
runs ``python3 -I -S "$ORCHARD_GRADER_DIR/grade.py"`` in the working copy. It reads the agent's ``answer.txt`` (the
working copy is input only: nothing of it is imported), writes ``$ORCHARD_GRADER_OUT/signals.json`` and exits 0 only
when the answer is exactly the reference value.

Signals (all 0 or 1, except ``progress``):

==================  ==========================================================================================
``answer_written``  ``answer.txt`` exists and is not blank
``answer_format``   its stripped content is one value, written as the values are (three digits)
``right_file``      it holds exactly one number, a value of the file the task named (in a two-hop task the
                    file ``index.txt`` names): the right file was read
                    (an answer listing many numbers earns nothing for them; values are unique
                    within a task, so a copied value says which file it came from)
``answer_correct``  its stripped content is the reference value (the exit status says the same)
``progress``        partial credit in [0, 1]: 1.0 when correct, else ``0.3 * right_file + 0.2 * answer_format``
==================  ==========================================================================================

So a value copied from the right file but for the wrong key earns 0.5, a well-formed value from another file (or a
guess) 0.2, a right value wrapped in extra text (``y=417``) 0.3, no answer 0.

A two-hop task grades the same: the reference names the file, so nothing the agent does to the working copy's
``index.txt`` moves the target, and ``index.txt`` (``file: owl.txt``, no digits) is no value file.

Every episode pays for this process, so it imports nothing beyond what the interpreter loads to start (``-S``: not
even ``site``): ``json`` alone (with the ``re`` and ``enum`` it pulls in) costs twice a bare start. Hence the
reference is the line format ``reference.txt`` (``file``, ``key`` and ``answer`` lines, a ``hops 2`` line in a two-hop
task (none: one hop), then one ``value <file> <key> <value>`` line per value; names and values hold no whitespace)
and the signals are written as JSON by hand.
"""

from __future__ import annotations

import os
import sys

ANSWER_FILE = "answer.txt"
OUT_ENV = "ORCHARD_GRADER_OUT"
SIGNALS_NAME = "signals.json"
REFERENCE_NAME = "reference.txt"
RIGHT_FILE_CREDIT = 0.3
FORMAT_CREDIT = 0.2
MAX_ANSWER_BYTES = 4096
VALUE_DIGITS = 3


def parse_reference(text: str) -> dict[str, object]:
    """``reference.txt`` as ``{"file", "key", "answer", "files": {file: {key: value}}}``, with ``"hops"`` when the
    file has that line (references written before two-hop tasks have none: one hop).

    >>> parse_reference("file owl.txt\\nkey y\\nanswer 417\\nvalue owl.txt x 233\\nvalue owl.txt y 417\\n")["files"]
    {'owl.txt': {'x': '233', 'y': '417'}}
    """
    reference: dict[str, object] = {}
    files: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("file", "key", "answer", "hops"):
            reference[words[0]] = words[1]
        elif len(words) == 4 and words[0] == "value":
            files.setdefault(words[1], {})[words[2]] = words[3]
        elif words:
            raise SystemExit(f"grade: unreadable line in {REFERENCE_NAME}: {line!r}")
    missing = [name for name in ("file", "key", "answer") if name not in reference]
    if missing:
        raise SystemExit(f"grade: {REFERENCE_NAME} has no {', '.join(missing)} line")
    reference["files"] = files
    return reference


def format_reference(reference: dict[str, object]) -> str:
    """The ``reference.txt`` text of ``reference`` (the inverse of ``parse_reference``)."""
    files = reference["files"]
    assert isinstance(files, dict)  # noqa: S101 - a programming error, not input
    rows = [[name, str(reference[name])] for name in ("file", "key", "answer")]
    rows += [["hops", str(reference["hops"])]] if "hops" in reference else []  # one hop: no line, as before
    rows += [["value", name, key, value] for name in sorted(files) for key, value in sorted(files[name].items())]
    for row in rows:
        if any(len(word.split()) != 1 for word in row):
            raise ValueError(f"reference.txt cannot hold an empty name or value, or whitespace in one: {row!r}")
    return "".join(" ".join(row) + "\n" for row in rows)


def numbers_in(text: str) -> list[str]:
    """The runs of ASCII digits in ``text``, in order."""
    found, run = [], ""
    for char in text + " ":
        if "0" <= char <= "9":
            run += char
        elif run:
            found.append(run)
            run = ""
    return found


def score(answer: str | None, reference: dict[str, object]) -> dict[str, float]:
    """The signals of ``answer`` (the content of ``answer.txt``, ``None`` when absent) against ``reference``.

    >>> ref = {"file": "owl.txt", "key": "y", "answer": "417", "files": {"owl.txt": {"x": "233", "y": "417"}}}
    >>> score("417\\n", ref)["progress"], score("233", ref)["progress"], score(None, ref)["progress"]
    (1.0, 0.5, 0.0)
    """
    text = (answer or "").strip()
    files = reference["files"]
    assert isinstance(files, dict)  # noqa: S101 - parse_reference built it
    target_values = set(files[reference["file"]].values())
    written = bool(text)
    numbers = numbers_in(text)
    well_formed = len(text) == VALUE_DIGITS and numbers == [text]  # three ASCII digits, nothing else
    right_file = len(numbers) == 1 and numbers[0] in target_values  # one value: a list of every number earns nothing
    correct = text == reference["answer"]
    progress = 1.0 if correct else RIGHT_FILE_CREDIT * right_file + FORMAT_CREDIT * well_formed
    return {
        "answer_correct": float(correct),
        "answer_format": float(well_formed),
        "answer_written": float(written),
        "progress": round(progress, 6),
        "right_file": float(right_file),
    }


def within(path: str, root: str) -> bool:
    """Whether ``path``, links resolved, is inside ``root`` (an answer linked to the grader's own reference is not)."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def read_answer(workdir: str) -> str | None:
    """The start of ``answer.txt`` as text, or ``None`` when it is not a readable regular file of the working copy."""
    path = os.path.join(workdir, ANSWER_FILE)
    if not os.path.isfile(path) or not within(path, workdir):  # a FIFO or device would block or never end
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_ANSWER_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def signals_json(signals: dict[str, float]) -> str:
    """``signals`` as one line of JSON, keys sorted (what ``json.dumps(signals, sort_keys=True)`` writes)."""
    return "{" + ", ".join(f'"{name}": {signals[name]!r}' for name in sorted(signals)) + "}\n"


def signals_path() -> str:
    """``$ORCHARD_GRADER_OUT/signals.json``; exits with an error naming the variable when it is not set."""
    out = os.environ.get(OUT_ENV)
    if not out:
        raise SystemExit(f"grade: {OUT_ENV} is not set (the Env's Sandbox.run_grader sets it)")
    return os.path.join(out, SIGNALS_NAME)


def main() -> int:
    """Grade the current directory; exit status 0 only for a correct answer."""
    target = signals_path()
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), REFERENCE_NAME), encoding="utf-8") as handle:
        reference = parse_reference(handle.read())
    signals = score(read_answer(os.getcwd()), reference)
    line = signals_json(signals)
    with open(target, "w", encoding="utf-8") as handle:
        handle.write(line)
    sys.stdout.write(line)
    return 0 if signals["answer_correct"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
