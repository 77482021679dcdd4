"""Success-rate (Wilson) and mean-reward (normal, bootstrap) intervals against hand-computed values."""

from __future__ import annotations

import math

import pytest

from orchard.evaluation.stats import (
    MeanStats,
    SuccessStats,
    bootstrap_interval,
    mean_stats,
    success_stats,
    success_stats_of,
    wilson_interval,
)


def wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """(p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), written out independently."""
    p = k / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = (z / (1 + z**2 / n)) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return centre - half, centre + half


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (8, 10, (0.4902, 0.9433)),  # the textbook example
        (1, 2, (0.0945, 0.9055)),
        (2, 4, (0.1500, 0.8500)),
        (0, 10, (0.0, 0.2775)),
        (10, 10, (0.7225, 1.0)),
        (3, 4, (0.3006, 0.9544)),
    ],
)
def test_wilson_interval_matches_hand_computed_bounds(k: int, n: int, expected: tuple[float, float]) -> None:
    low, high = wilson_interval(k, n)

    assert (round(low, 4), round(high, 4)) == expected
    by_hand = wilson_by_hand(k, n)
    assert low == pytest.approx(max(0.0, by_hand[0]), abs=1e-12)
    assert high == pytest.approx(min(1.0, by_hand[1]), abs=1e-12)


def test_wilson_bounds_are_exactly_0_and_1_at_the_extremes() -> None:
    assert wilson_interval(0, 7)[0] == 0.0
    assert wilson_interval(7, 7)[1] == 1.0


def test_success_stats_carry_count_n_rate_and_interval() -> None:
    stats = success_stats_of([True, False, True, True])

    assert stats == SuccessStats(3, 4, 0.75, *wilson_interval(3, 4))
    assert success_stats(3, 4) == stats


@pytest.mark.parametrize(("k", "n"), [(0, 0), (-1, 3), (4, 3)])
def test_impossible_counts_are_refused_naming_the_values(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="n"):
        wilson_interval(k, n)


def test_normal_interval_of_the_mean_is_mean_plus_minus_z_s_over_root_n() -> None:
    # mean 2.5, s = sqrt(5/3) = 1.290994, s/sqrt(4) = 0.645497, times 1.959964 = 1.265151
    stats = mean_stats([1.0, 2.0, 3.0, 4.0])

    assert (stats.n, stats.mean, stats.method) == (4, 2.5, "normal")
    assert (round(stats.low or 0.0, 4), round(stats.high or 0.0, 4)) == (1.2348, 3.7652)


def test_one_value_has_a_mean_but_no_interval() -> None:
    assert mean_stats([0.7]) == MeanStats(n=1, mean=0.7, low=None, high=None, method="normal")
    assert mean_stats([0.7], "bootstrap") == MeanStats(n=1, mean=0.7, low=None, high=None, method="bootstrap")


def test_constant_values_have_a_zero_width_interval_with_either_method() -> None:
    assert mean_stats([0.5, 0.5, 0.5]) == MeanStats(3, 0.5, 0.5, 0.5, "normal")
    assert mean_stats([0.5, 0.5, 0.5], "bootstrap") == MeanStats(3, 0.5, 0.5, 0.5, "bootstrap")


def test_bootstrap_is_reproducible_with_its_seed_and_close_to_normal_for_many_values() -> None:
    values = [float(i % 2) for i in range(400)]  # mean 0.5, s ~ 0.5006, normal half-width ~ 0.0491

    first = mean_stats(values, "bootstrap", seed=3)
    again = mean_stats(values, "bootstrap", seed=3)
    normal = mean_stats(values)

    assert first == again
    assert first.low == pytest.approx(normal.low, abs=0.01)
    assert first.high == pytest.approx(normal.high, abs=0.01)


def test_bootstrap_of_two_values_stays_within_their_range() -> None:
    low, high = bootstrap_interval([0.0, 1.0], resamples=2000)

    assert (low, high) == (0.0, 1.0)


def test_mean_of_nothing_and_unknown_methods_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        mean_stats([])
    with pytest.raises(ValueError, match="'normal' or 'bootstrap'"):
        mean_stats([1.0, 2.0], "exact")  # type: ignore[arg-type]
