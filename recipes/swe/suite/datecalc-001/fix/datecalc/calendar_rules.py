"""Year-level calendar rules."""


def is_leap(year: int) -> bool:
    """Gregorian leap year."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_year(year: int) -> int:
    """365 or 366."""
    return 366 if is_leap(year) else 365
