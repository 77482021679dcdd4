"""Date arithmetic."""

from datecalc.calendar_rules import days_in_year, is_leap
from datecalc.months import add_months, days_in_month

__all__ = ["add_months", "days_in_month", "days_in_year", "is_leap"]
