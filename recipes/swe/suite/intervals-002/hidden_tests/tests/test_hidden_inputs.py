from intervals import merge, total_length


def test_merge_does_not_reorder_callers_list():
    spans = [(8, 9), (1, 2)]
    merge(spans)
    assert spans == [(8, 9), (1, 2)]


def test_merge_accepts_tuples_and_generators():
    assert merge(((5, 6), (1, 2))) == [(1, 2), (5, 6)]
    assert total_length(iter([(0, 2), (1, 3)])) == 3


def test_merge_result_is_sorted():
    assert merge([[3, 4], [1, 2]]) == [(1, 2), (3, 4)]
