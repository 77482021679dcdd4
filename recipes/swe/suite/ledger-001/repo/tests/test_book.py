from decimal import Decimal

import pytest

from ledger import InsufficientFunds, Ledger


def make():
    book = Ledger()
    book.open("alice")
    book.open("bob")
    return book


def test_deposit_and_withdraw():
    book = make()
    book.deposit("alice", "10.00")
    book.withdraw("alice", 4)
    assert book.balance("alice") == Decimal("6.00")


def test_withdraw_cannot_overdraw():
    book = make()
    with pytest.raises(InsufficientFunds):
        book.withdraw("bob", "1")


def test_transfer_moves_money():
    book = make()
    book.deposit("alice", "5")
    book.deposit("bob", "5")
    book.transfer("alice", "bob", "2.50")
    assert (book.balance("alice"), book.balance("bob")) == (Decimal("2.50"), Decimal("7.50"))


def test_negative_amount_rejected():
    with pytest.raises(ValueError):
        make().deposit("alice", "-1")
