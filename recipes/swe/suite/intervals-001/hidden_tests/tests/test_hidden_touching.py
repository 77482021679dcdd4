from intervals import merge, total_length


def test_touching_intervals_are_merged():
    assert merge([(1, 3), (3, 5)]) == [(1, 5)]


def test_chain_of_touching_intervals():
    assert merge([(0, 1), (1, 2), (2, 3)]) == [(0, 3)]


def test_disjoint_intervals_stay_apart():
    assert merge([(1, 2), (4, 5)]) == [(1, 2), (4, 5)]
    assert total_length([(1, 2), (4, 5)]) == 2
