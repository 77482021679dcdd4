import pytest

from csvlite import read_records, read_rows, write_rows


def test_simple_rows():
    assert read_rows("a,b\n1,2\n") == [["a", "b"], ["1", "2"]]


def test_quoted_field_with_comma():
    assert read_rows('name,city\nAda,"London, UK"\n')[1] == ["Ada", "London, UK"]


def test_records():
    assert read_records("id,name\n1,Ada\n") == [{"id": "1", "name": "Ada"}]


def test_ragged_row_rejected():
    with pytest.raises(ValueError):
        read_records("a,b\n1\n")


def test_write_quotes_delimiter():
    assert write_rows([["x,y", "z"]]) == '"x,y",z\n'
