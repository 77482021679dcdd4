import pytest

from bitset import BitSet


def test_add_and_iterate():
    b = BitSet(8)
    b.add(1)
    b.add(5)
    assert list(b) == [1, 5]
    assert len(b) == 2


def test_discard():
    b = BitSet(4)
    b.add(2)
    b.discard(2)
    assert 2 not in b


def test_negative_index():
    with pytest.raises(IndexError):
        BitSet(4).add(-1)
