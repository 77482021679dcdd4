from decimal import Decimal

from money import allocate, format_amount, round_amount


def test_yen_has_no_decimals():
    assert round_amount("1234.5", "JPY") == Decimal("1235")
    assert format_amount("1234.4", "JPY") == "1,234 JPY"


def test_dinar_has_three_decimals():
    assert format_amount("1.2345", "KWD") == "1.235 KWD"


def test_allocate_yen():
    assert allocate("100", 3, "JPY") == [Decimal("34"), Decimal("33"), Decimal("33")]


def test_allocate_usd():
    assert allocate("100", 3, "USD") == [Decimal("33.34"), Decimal("33.33"), Decimal("33.33")]
