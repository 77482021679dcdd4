import pytest

from roman import from_roman, to_roman


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"


def test_from_roman_subtractive():
    assert from_roman("XIV") == 14


def test_zero_rejected():
    with pytest.raises(ValueError):
        to_roman(0)


def test_non_canonical_rejected():
    with pytest.raises(ValueError):
        from_roman("IIII")
