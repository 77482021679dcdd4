"""Display formatting."""

from decimal import Decimal

from money.amounts import round_amount
from money.currency import minor_units


def format_amount(amount: Decimal | str | int, currency: str) -> str:
    """E.g. ``"1,234.50 USD"``: thousands separators and the currency's number of decimals."""
    value = round_amount(amount, currency)
    digits = minor_units(currency)
    return f"{value:,.{digits}f} {currency}"
