import pytest

from descstats import mean, mode, percentile


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty_rejected():
    with pytest.raises(ValueError):
        mean([])


def test_mode_single_winner():
    assert mode([3, 1, 3, 2]) == 3


def test_median_percentile():
    assert percentile([1, 3, 2], 50) == 2
