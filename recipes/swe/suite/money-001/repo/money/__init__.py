"""Currency-aware money helpers."""

from money.amounts import allocate, round_amount
from money.currency import minor_units
from money.fmt import format_amount

__all__ = ["allocate", "format_amount", "minor_units", "round_amount"]
