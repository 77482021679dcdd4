from descstats import mode


def test_tie_resolves_to_smallest_value():
    assert mode([5, 1, 5, 1]) == 1


def test_all_distinct_values_give_minimum():
    assert mode([9, 4, 7]) == 4


def test_clear_winner():
    assert mode([2, 2, 8]) == 2
