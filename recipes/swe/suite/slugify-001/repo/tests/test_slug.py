from slugify import slugify


def test_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_accents():
    assert slugify("Crème Brûlée") == "creme-brulee"


def test_custom_separator():
    assert slugify("a b", separator="_") == "a_b"


def test_short_slug_not_truncated():
    assert slugify("abc", max_length=10) == "abc"
