import pytest

from versions import compare, parse


def test_parse():
    assert parse("v1.2.3-rc.1")[1] == ("rc", "1")


def test_simple_ordering():
    assert compare("1.2.3", "1.3.0") == -1


def test_equal():
    assert compare("2.0.1", "2.0.1") == 0


def test_invalid():
    with pytest.raises(ValueError):
        parse("latest")
