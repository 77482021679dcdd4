"""Confidence intervals for held-out evaluation: a success rate (Wilson score interval) and a mean reward (normal
approximation or percentile bootstrap). Pure functions over plain numbers.

The Wilson interval is used for the success rate because the normal ("Wald") interval collapses to zero width at
0 or n successes and undercovers for the small n of a held-out split; Wilson stays inside [0, 1] and keeps close to
its nominal coverage down to a handful of tasks.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Z_95 = 1.959963984540054
"""The two-sided 95% quantile of the standard normal distribution."""
CiMethod = Literal["normal", "bootstrap"]


@dataclass(frozen=True, slots=True)
class SuccessStats:
    """A success rate over ``n`` trials with its Wilson interval ``[low, high]``."""

    successes: int
    n: int
    rate: float
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class MeanStats:
    """A mean over ``n`` values with its interval; ``low``/``high`` are None when ``n < 2`` (no spread to measure)."""

    n: int
    mean: float
    low: float | None
    high: float | None
    method: CiMethod


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n``.

    >>> tuple(round(x, 4) for x in wilson_interval(8, 10))
    (0.4902, 0.9433)
    """
    _check_counts(successes, n)
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # at 0 or n successes the bound is exactly 0 or 1; rounding must not push it past
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def success_stats(successes: int, n: int, z: float = Z_95) -> SuccessStats:
    """The success rate of ``successes`` out of ``n`` (n >= 1) with its Wilson interval."""
    low, high = wilson_interval(successes, n, z)
    return SuccessStats(successes=successes, n=n, rate=successes / n, low=low, high=high)


def success_stats_of(outcomes: Sequence[bool], z: float = Z_95) -> SuccessStats:
    """``success_stats`` of a sequence of per-trial successes."""
    return success_stats(sum(bool(o) for o in outcomes), len(outcomes), z)


def mean_stats(
    values: Sequence[float],
    method: CiMethod = "normal",
    *,
    z: float = Z_95,
    resamples: int = 10_000,
    seed: int = 0,
) -> MeanStats:
    """The mean of ``values`` (at least one) with a 95% interval.

    ``normal``: mean ± z·s/√n with the sample standard deviation s. ``bootstrap``: the 2.5th and 97.5th
    percentiles of the means of ``resamples`` resamples drawn with a fixed ``seed`` (so a table is reproducible).

    >>> stats = mean_stats([1.0, 2.0, 3.0, 4.0])
    >>> stats.mean, round(stats.low, 4), round(stats.high, 4)
    (2.5, 1.2348, 3.7652)
    """
    if not values:
        raise ValueError("the mean of no values is undefined: give at least one value")
    if method not in ("normal", "bootstrap"):
        raise ValueError(f"method must be 'normal' or 'bootstrap', got {method!r}")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return MeanStats(n=n, mean=mean, low=None, high=None, method=method)
    if method == "normal":
        half = z * statistics.stdev(values) / math.sqrt(n)
        return MeanStats(n=n, mean=mean, low=mean - half, high=mean + half, method=method)
    low, high = bootstrap_interval(values, resamples=resamples, seed=seed)
    return MeanStats(n=n, mean=mean, low=low, high=high, method=method)


def bootstrap_interval(
    values: Sequence[float], *, resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values``."""
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(resamples, len(data)))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _check_counts(successes: int, n: int) -> None:
    if n < 1:
        raise ValueError(f"a success rate needs n >= 1 trials, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be between 0 and n={n}, got {successes}")
