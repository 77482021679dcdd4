from datetime import timedelta

import pytest

from durations import format_duration, parse_duration


def test_format_hours_minutes_seconds():
    assert format_duration(timedelta(hours=2, seconds=5)) == "2h 5s"


def test_format_zero():
    assert format_duration(timedelta(0)) == "0s"


def test_parse_round_trip():
    assert parse_duration("3h 4m") == timedelta(hours=3, minutes=4)


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_duration("5x")
