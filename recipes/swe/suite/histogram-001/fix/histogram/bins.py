"""Equal-width histograms."""

from collections.abc import Sequence


def histogram(values: Sequence[float], bins: int, lo: float | None = None, hi: float | None = None) -> list[int]:
    """Counts per bin over ``[lo, hi]`` (data range by default); the last bin includes ``hi``."""
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    counts = [0] * bins
    if not values:
        return counts
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    if hi == lo:
        counts[0] = sum(1 for v in values if v == lo)
        return counts
    width = (hi - lo) / bins
    for v in values:
        if lo <= v <= hi:
            counts[min(int((v - lo) / width), bins - 1)] += 1
    return counts
