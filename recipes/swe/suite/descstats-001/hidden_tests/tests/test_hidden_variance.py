import pytest

from descstats import variance


def test_sample_variance_divides_by_n_minus_one():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(32 / 7)


def test_population_variance_divides_by_n():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == pytest.approx(4.0)


def test_sample_variance_needs_two_points():
    with pytest.raises(ValueError):
        variance([1.0])
