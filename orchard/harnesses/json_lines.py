"""Reading the JSON-lines output harnesses write (event streams, rollouts, the built-in agent's log)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``text``, one a line, in order; lines that are not a JSON object are skipped (a harness
    may interleave plain log lines, and a line cut off by a kill is not an error).

    >>> list(json_objects('{"a": 1}\\nnoise\\n[1]\\n{"b": 2}'))
    [{'a': 1}, {'b': 2}]
    """
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value
