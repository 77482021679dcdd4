import pytest

from histogram import histogram


def test_counts():
    assert histogram([0, 1, 2, 3, 4, 10], 2) == [5, 1]


def test_explicit_range_ignores_outliers():
    assert histogram([-5, 1, 2, 50], 2, lo=0, hi=4) == [1, 1]


def test_empty():
    assert histogram([], 3) == [0, 0, 0]


def test_bad_bins():
    with pytest.raises(ValueError):
        histogram([1], 0)
