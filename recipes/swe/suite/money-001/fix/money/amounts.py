"""Rounding and allocation."""

from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

from money.currency import minor_units


def _unit(currency: str) -> Decimal:
    return Decimal(1).scaleb(-minor_units(currency))


def round_amount(amount: Decimal | str | int, currency: str) -> Decimal:
    """``amount`` rounded half up to the minor unit of ``currency``."""
    return Decimal(amount).quantize(_unit(currency), rounding=ROUND_HALF_UP)


def allocate(total: Decimal | str | int, parts: int, currency: str) -> list[Decimal]:
    """Split ``total`` into ``parts`` amounts that differ by at most one minor unit and sum to ``total``."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    unit = _unit(currency)
    total = round_amount(total, currency)
    share = (total / parts).quantize(unit, rounding=ROUND_DOWN)
    remainder = int((total - share * parts) / unit)
    return [share + unit if i < remainder else share for i in range(parts)]
