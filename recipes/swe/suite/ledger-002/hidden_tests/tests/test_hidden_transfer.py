from decimal import Decimal

import pytest

from ledger import InsufficientFunds, Ledger


def test_transfer_cannot_overdraw_source():
    book = Ledger()
    book.open("a")
    book.open("b")
    book.deposit("b", "100")
    with pytest.raises(InsufficientFunds):
        book.transfer("a", "b", "10")
    assert book.balance("a") == Decimal("0.00")


def test_transfer_to_empty_account():
    book = Ledger()
    book.open("a")
    book.open("b")
    book.deposit("a", "10")
    book.transfer("a", "b", "10")
    assert book.balance("b") == Decimal("10.00")
