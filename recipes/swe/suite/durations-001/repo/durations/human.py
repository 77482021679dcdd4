"""Formatting and parsing of compact duration strings."""

import re
from datetime import timedelta

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
_PART = re.compile(r"\s*(\d+)([dhms])")


def format_duration(delta: timedelta) -> str:
    """Format ``delta`` as e.g. ``"1d 2h 3m 4s"``, omitting zero units (whole seconds)."""
    total = delta.seconds
    sign = "-" if total < 0 else ""
    remaining = abs(total)
    parts = []
    for suffix, size in _UNITS:
        value, remaining = divmod(remaining, size)
        if value:
            parts.append(f"{value}{suffix}")
    return sign + (" ".join(parts) or "0s")


def parse_duration(text: str) -> timedelta:
    """Parse a string made by :func:`format_duration` back into a timedelta."""
    body = text.strip()
    negative = body.startswith("-")
    body = body.lstrip("-")
    seconds = 0
    pos = 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None:
            raise ValueError(f"invalid duration: {text!r}")
        seconds += int(match.group(1)) * dict(_UNITS)[match.group(2)]
        pos = match.end()
    return timedelta(seconds=-seconds if negative else seconds)
