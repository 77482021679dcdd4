import pytest

from roman import from_roman, to_roman


def test_largest_supported_number():
    assert to_roman(3999) == "MMMCMXCIX"


def test_largest_numeral_decodes():
    assert from_roman("MMMCMXCIX") == 3999


def test_above_range_rejected():
    with pytest.raises(ValueError):
        to_roman(4000)
