"""Word tokenization."""

import re

# Words are runs of letters, digits and apostrophes.
_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z0-9]+)*")


def words(text: str) -> list[str]:
    """Return the lowercase words of ``text`` in order of appearance."""
    return [w.lower() for w in _WORD.findall(text)]
