import pytest

from iniparse import ParseError, parse


def test_error_reports_one_based_line_number():
    with pytest.raises(ParseError) as info:
        parse("[a]\nx = 1\nnot a pair\n")
    assert info.value.lineno == 3
    assert str(info.value).startswith("line 3:")


def test_first_line_is_line_one():
    with pytest.raises(ParseError) as info:
        parse("k = v")
    assert info.value.lineno == 1


def test_valid_document_parses():
    assert parse("[a]\nx = 1") == {"a": {"x": "1"}}
