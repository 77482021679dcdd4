import pytest

from template import MissingVariable, render, variables


def test_render():
    assert render("Hi {{ name }}!", {"name": "Ada"}) == "Hi Ada!"


def test_dotted():
    assert render("{{user.city}}", {"user": {"city": "Oslo"}}) == "Oslo"


def test_missing():
    with pytest.raises(MissingVariable):
        render("{{ nope }}", {})


def test_variables():
    assert variables("{{b}} {{a}} {{b}}") == ["b", "a"]
