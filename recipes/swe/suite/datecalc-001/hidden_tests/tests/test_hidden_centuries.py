from datetime import date

from datecalc import add_months, days_in_month, days_in_year, is_leap


def test_century_years_are_not_leap():
    assert not is_leap(1900)
    assert days_in_year(2100) == 365


def test_february_of_century_year():
    assert days_in_month(1900, 2) == 28
    assert add_months(date(1900, 1, 31), 1) == date(1900, 2, 28)


def test_year_2000_is_leap():
    assert is_leap(2000)
    assert days_in_month(2000, 2) == 29
