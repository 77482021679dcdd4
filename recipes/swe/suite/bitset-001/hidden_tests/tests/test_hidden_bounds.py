import pytest

from bitset import BitSet


def test_index_equal_to_size_rejected():
    b = BitSet(8)
    with pytest.raises(IndexError):
        b.add(8)
    assert len(b) == 0


def test_discard_at_size_rejected():
    with pytest.raises(IndexError):
        BitSet(3).discard(3)


def test_last_valid_index():
    b = BitSet(8)
    b.add(7)
    assert list(b) == [7]
