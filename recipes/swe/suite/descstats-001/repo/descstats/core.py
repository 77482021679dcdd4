"""Mean, variance, mode and percentiles."""

import math
from collections import Counter
from collections.abc import Sequence


def mean(xs: Sequence[float]) -> float:
    """Arithmetic mean; raises ValueError on empty data."""
    if not xs:
        raise ValueError("mean of empty data")
    return sum(xs) / len(xs)


def variance(xs: Sequence[float], sample: bool = True) -> float:
    """Sample variance (divides by n - 1) or, with ``sample=False``, population variance (divides by n)."""
    n = len(xs)
    if n < (2 if sample else 1):
        raise ValueError("not enough data for variance")
    m = mean(xs)
    squares = sum((x - m) ** 2 for x in xs)
    return squares / (n if sample else n - 1)


def mode(xs: Sequence[float]) -> float:
    """Most common value; among equally common values the smallest wins."""
    if not xs:
        raise ValueError("mode of empty data")
    counts = Counter(xs)
    best = max(counts.values())
    return min(value for value, count in counts.items() if count == best)


def percentile(xs: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not xs or not 0 <= p <= 100:
        raise ValueError("percentile needs data and 0 <= p <= 100")
    ordered = sorted(xs)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
