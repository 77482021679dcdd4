import pytest

from intervals import contains, merge, total_length


def test_merge_overlapping():
    assert merge([(1, 4), (2, 6), (8, 9)]) == [(1, 6), (8, 9)]


def test_merge_unsorted_input():
    assert merge([(8, 9), (1, 2)]) == [(1, 2), (8, 9)]


def test_total_length_counts_overlap_once():
    assert total_length([(0, 10), (5, 15)]) == 15


def test_contains_includes_ends():
    assert contains([(1, 3)], 3)


def test_reversed_interval_rejected():
    with pytest.raises(ValueError):
        merge([(5, 1)])
