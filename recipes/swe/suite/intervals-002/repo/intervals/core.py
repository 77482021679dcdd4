"""Merging and measuring closed intervals."""

from collections.abc import Iterable

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals; the input is left unchanged."""
    ordered = intervals
    ordered.sort()
    merged: list[Interval] = []
    for start, end in ordered:
        if start > end:
            raise ValueError(f"interval start {start} is after its end {end}")
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total_length(intervals: Iterable[Interval]) -> int:
    """Total length covered by the union of ``intervals``."""
    return sum(end - start for start, end in merge(intervals))


def contains(intervals: Iterable[Interval], point: int) -> bool:
    """Whether ``point`` lies in any of ``intervals`` (ends included)."""
    return any(start <= point <= end for start, end in intervals)
