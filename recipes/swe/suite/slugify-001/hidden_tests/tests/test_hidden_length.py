from slugify import slugify


def test_truncated_to_exactly_max_length():
    assert slugify("abcdefghij", max_length=5) == "abcde"


def test_truncation_drops_trailing_separator():
    assert slugify("hello world again", max_length=6) == "hello"


def test_multi_word_truncation():
    assert slugify("one two three", max_length=7) == "one-two"
