from datetime import timedelta

from durations import format_duration, parse_duration


def test_format_includes_days():
    assert format_duration(timedelta(days=1, hours=2, minutes=3, seconds=4)) == "1d 2h 3m 4s"


def test_format_negative_duration():
    assert format_duration(timedelta(minutes=-90)) == "-1h 30m"


def test_round_trip_under_a_day():
    assert parse_duration(format_duration(timedelta(minutes=61))) == timedelta(minutes=61)
