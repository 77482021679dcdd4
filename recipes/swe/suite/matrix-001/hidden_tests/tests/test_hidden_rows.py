from matrix import identity, multiply, trace, zeros


def test_identity_has_ones_only_on_diagonal():
    assert identity(3) == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


def test_zeros_rows_are_independent():
    m = zeros(2, 2)
    m[0][0] = 5.0
    assert m == [[5.0, 0.0], [0.0, 0.0]]


def test_two_by_two_product():
    assert multiply([[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]) == [[19.0, 22.0], [43.0, 50.0]]


def test_trace():
    assert trace([[1.0, 9.0], [9.0, 2.0]]) == 3.0
