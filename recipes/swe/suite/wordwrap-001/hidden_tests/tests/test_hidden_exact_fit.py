from wordwrap import wrap


def test_line_exactly_width_is_kept_together():
    assert wrap("hello world", 11) == ["hello world"]


def test_exact_fit_in_the_middle():
    assert wrap("aa bb cc dd", 5) == ["aa bb", "cc dd"]


def test_no_line_exceeds_width():
    assert all(len(line) <= 7 for line in wrap("lorem ipsum dolor sit amet consectetur", 7))
