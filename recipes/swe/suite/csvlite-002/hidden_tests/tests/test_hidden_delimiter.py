from csvlite import read_records, read_rows, write_rows


def test_semicolon_delimiter():
    assert read_rows("a;b\n1;2,5\n", delimiter=";") == [["a", "b"], ["1", "2,5"]]


def test_tab_separated_records():
    assert read_records("id\tname\n7\tAda\n", delimiter="\t") == [{"id": "7", "name": "Ada"}]


def test_round_trip_with_pipe():
    rows = [["a|b", "c"]]
    assert read_rows(write_rows(rows, delimiter="|"), delimiter="|") == rows


def test_default_comma():
    assert read_rows("x,y\n") == [["x", "y"]]
