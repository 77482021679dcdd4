from datetime import date

from datecalc import add_months, days_in_month, days_in_year, is_leap


def test_leap_years():
    assert is_leap(2024) and not is_leap(2023)


def test_days_in_year():
    assert days_in_year(2024) == 366


def test_february():
    assert days_in_month(2024, 2) == 29


def test_add_months_clamps():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)


def test_add_negative_months():
    assert add_months(date(2024, 1, 15), -1) == date(2023, 12, 15)
