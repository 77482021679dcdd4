from versions import compare, parse, sort_versions


def test_components_compare_numerically():
    assert compare("1.10.0", "1.9.0") == 1


def test_sort_versions():
    assert sort_versions(["1.10", "1.2", "1.9.1"]) == ["1.2", "1.9.1", "1.10"]


def test_parse_returns_ints():
    assert parse("3.14") == ((3, 14), ())
