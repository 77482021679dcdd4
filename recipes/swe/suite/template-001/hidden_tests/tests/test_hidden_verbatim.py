from template import render


def test_backslashes_inserted_verbatim():
    assert render("path: {{ p }}", {"p": "C:\\Users\\ada"}) == "path: C:\\Users\\ada"


def test_group_reference_like_text_verbatim():
    assert render("{{ x }}", {"x": "\\1\\g<0>"}) == "\\1\\g<0>"


def test_repeated_placeholder():
    assert render("{{a}}-{{a}}", {"a": 1}) == "1-1"
