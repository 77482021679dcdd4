"""Month-level arithmetic."""

from datetime import date

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def days_in_month(year: int, month: int) -> int:
    """Number of days in ``month`` of ``year``."""
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return 29
    return _DAYS[month - 1]


def add_months(day: date, months: int) -> date:
    """``day`` moved by ``months`` (may be negative), clamping to the end of the target month."""
    index = day.month - 1 + months
    year, month = day.year + index // 12, index % 12 + 1
    return day.replace(year=year, month=month, day=min(day.day, days_in_month(year, month)))
