from decimal import Decimal

import pytest

from money import allocate, format_amount, minor_units, round_amount


def test_round_usd():
    assert round_amount("2.346", "USD") == Decimal("2.35")


def test_format_usd():
    assert format_amount("1234.5", "USD") == "1,234.50 USD"


def test_allocate_sums_to_total():
    assert sum(allocate("100", 4, "EUR")) == Decimal("100")


def test_unknown_currency():
    with pytest.raises(ValueError):
        minor_units("XXX")
