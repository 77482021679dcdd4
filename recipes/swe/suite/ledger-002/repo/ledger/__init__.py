"""Account ledger."""

from ledger.book import InsufficientFunds, Ledger, to_amount

__all__ = ["InsufficientFunds", "Ledger", "to_amount"]
