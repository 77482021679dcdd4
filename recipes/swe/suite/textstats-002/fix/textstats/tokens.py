"""Word tokenization."""

import re

# Words are runs of letters, digits and apostrophes, in any script.
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def words(text: str) -> list[str]:
    """Return the lowercase words of ``text`` in order of appearance."""
    return [w.lower() for w in _WORD.findall(text)]
