import pytest

from matrix import multiply, transpose


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_row_times_column():
    assert multiply([[1.0, 2.0]], [[3.0], [4.0]]) == [[11.0]]


def test_shape_mismatch_rejected():
    with pytest.raises(ValueError):
        multiply([[1.0, 2.0]], [[1.0, 2.0]])
