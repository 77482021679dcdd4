"""Display formatting."""

from decimal import Decimal

from money.amounts import round_amount


def format_amount(amount: Decimal | str | int, currency: str) -> str:
    """E.g. ``"1,234.50 USD"``: thousands separators and the currency's number of decimals."""
    value = round_amount(amount, currency)
    return f"{value:,.2f} {currency}"
