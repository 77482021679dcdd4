"""Parsing and ordering version strings."""

import functools
import re

_PATTERN = re.compile(r"v?(\d+(?:\.\d+)*)(?:-([0-9A-Za-z.]+))?")


def parse(text: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Split ``text`` into (numeric release parts, pre-release parts)."""
    match = _PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid version: {text!r}")
    release = tuple(int(part) for part in match.group(1).split("."))
    pre = tuple(match.group(2).split(".")) if match.group(2) else ()
    return release, pre


def _pre_key(part: str) -> tuple[int, int, str]:
    return (0, int(part), "") if part.isdigit() else (1, 0, part)


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version ``a`` is older, equal or newer than ``b``."""
    ra, pa = parse(a)
    rb, pb = parse(b)
    width = max(len(ra), len(rb))
    ra += (0,) * (width - len(ra))
    rb += (0,) * (width - len(rb))
    if ra != rb:
        return -1 if ra < rb else 1
    if pa == pb:
        return 0
    if not pa:
        return 1
    if not pb:
        return -1
    return -1 if [_pre_key(p) for p in pa] < [_pre_key(p) for p in pb] else 1


def sort_versions(items: list[str]) -> list[str]:
    """``items`` sorted oldest first."""
    return sorted(items, key=functools.cmp_to_key(compare))
