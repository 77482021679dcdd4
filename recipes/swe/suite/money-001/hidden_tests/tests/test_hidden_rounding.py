from decimal import Decimal

from money import format_amount, round_amount


def test_half_cent_rounds_up():
    assert round_amount("0.125", "USD") == Decimal("0.13")


def test_half_yen_rounds_up():
    assert round_amount("2.5", "JPY") == Decimal("3")


def test_format_rounds_half_up():
    assert format_amount("10.005", "EUR") == "10.01 EUR"


def test_non_tie_rounding():
    assert round_amount("0.126", "USD") == Decimal("0.13")
