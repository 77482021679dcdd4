from decimal import Decimal

from ledger import Ledger, to_amount


def test_float_taken_at_printed_value():
    assert to_amount(1.005) == Decimal("1.01")


def test_float_deposits_add_up():
    book = Ledger()
    book.open("a")
    book.deposit("a", 2.675)
    book.deposit("a", 0.125)
    assert book.balance("a") == Decimal("2.81")


def test_string_amount():
    assert to_amount("0.125") == Decimal("0.13")
