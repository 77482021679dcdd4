import pytest

from wordwrap import fill, wrap


def test_wraps_words():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]


def test_long_word_split():
    assert wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]


def test_fill():
    assert fill("a b", 1) == "a\nb"


def test_bad_width():
    with pytest.raises(ValueError):
        wrap("x", 0)
