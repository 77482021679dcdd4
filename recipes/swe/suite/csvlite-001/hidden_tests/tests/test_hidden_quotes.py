from csvlite import read_rows, write_rows


def test_doubled_quote_is_literal_quote():
    assert read_rows('a\n"say ""hi"""\n')[1] == ['say "hi"']


def test_writer_output_reads_back():
    rows = [["He said \"no\"", "plain"]]
    assert read_rows(write_rows(rows)) == rows


def test_empty_quoted_field():
    assert read_rows('"",x\n') == [["", "x"]]
