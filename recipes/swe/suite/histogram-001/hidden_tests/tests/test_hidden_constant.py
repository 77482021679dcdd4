from histogram import histogram


def test_all_values_equal():
    assert histogram([3, 3, 3], 4) == [3, 0, 0, 0]


def test_single_value():
    assert histogram([7.5], 2) == [1, 0]


def test_max_value_in_last_bin():
    assert histogram([0, 10], 5) == [1, 0, 0, 0, 1]
